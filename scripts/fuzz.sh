#!/usr/bin/env bash
# The long fuzz run: 100,000 mutated records through the decoders and through a running processor
# on the embedded broker (CI runs a short one). Reproduce a failure with its seed:
#   ENCORE_FUZZ_SEED=7 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export ENCORE_FUZZ_RECORDS=${ENCORE_FUZZ_RECORDS:-100000}
export ENCORE_FUZZ_PROCESSOR_RECORDS=${ENCORE_FUZZ_PROCESSOR_RECORDS:-100000}
export ENCORE_FUZZ_PARTITIONS=${ENCORE_FUZZ_PARTITIONS:-256}
export ENCORE_FUZZ_SEED=${ENCORE_FUZZ_SEED:-$(date +%s)}
echo "fuzzing with seed $ENCORE_FUZZ_SEED: $ENCORE_FUZZ_RECORDS records through the decoders," \
  "$ENCORE_FUZZ_PROCESSOR_RECORDS through the processor"
swift build --build-tests
# One after the other: on two cores, the decoders' run would starve the processor's.
swift test --skip-build --filter DecoderFuzzTests
swift test --skip-build --filter ProcessorFuzzTests
