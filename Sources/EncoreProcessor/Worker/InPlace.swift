/// Runs `body` on `value` where it lies: given `&dictionary.values[index]`, the dictionary's modify
/// accessor lends the value, where a read through a getter makes a copy of it (every buffer it
/// holds retained, then released), which on the hot path is paid for every record.
@inline(__always)
func inPlace<Value, Result>(_ value: inout Value, _ body: (inout Value) -> Result) -> Result {
    body(&value)
}
