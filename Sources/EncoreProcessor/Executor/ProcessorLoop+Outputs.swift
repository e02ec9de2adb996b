import Dispatch
import EncoreEvents
import Kafka

/// The loop's way out: outputs are encoded and produced on a queue of their own, in order.
extension ProcessorLoop {
    /// Hands the batch's outputs to the output queue in one hop; it encodes and produces them in
    /// order, so one user's outputs keep their order. Answers come back with the token.
    func flushOutputs() {
        guard outputs.hasUnsent else { return }
        // While a transaction commits, outputs wait for the next one.
        if let state = transactions, !state.acceptsOutputs { return }
        let unsent = outputs.takeUnsent()
        // (Changelog records that turned out not to be ready yet: nothing to produce.)
        guard !unsent.isEmpty else { return }
        transactions?.handed(unsent.count)
        let (encoder, producer, inbox) = (self.encoder, self.producer, self.inbox)
        outputQueue.async(execute: { Self.produce(unsent, encoder: encoder, producer: producer, inbox: inbox) })
    }

    static func produce(
        _ outputs: [(token: UInt, output: UnsentOutput)], encoder: OutputEncoder, producer: any OutputProducer,
        inbox: Inbox<ProcessorInput>
    ) {
        var refused: [KafkaDelivery] = []
        for (token, output) in outputs {
            let record = encoder.record(for: output)
            do {
                try producer.produce(record, token: token)
            } catch {
                // Reported like a failed delivery: a full local queue is tried again, anything else stops.
                let failure = KafkaError(
                    code: error.code, message: "cannot enqueue output: \(error.message)",
                    isRetriable: error.isRetriable, isFatal: error.isFatal)
                refused.append(KafkaDelivery(token: token, error: failure, record: record))
            }
        }
        if !refused.isEmpty { inbox.post(.delivered(refused)) }
    }

    /// Waits until every output handed to the output queue has been given to the producer.
    func waitForOutputs() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            outputQueue.async(execute: { continuation.resume() })
        }
    }
}

/// What the loop needs of the consumer: flow control and commits. ``KafkaConsumer`` provides it.
protocol ConsumerControl: Sendable {
    func pause(_ partitions: [KafkaTopicPartition]) throws(KafkaError)
    func resume(_ partitions: [KafkaTopicPartition]) throws(KafkaError)
    func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError)
}

/// What the loop needs of the producer. ``KafkaProducer`` provides it; the answers reach the
/// loop's inbox as ``ProcessorInput/delivered(_:)`` batches, with the token.
protocol OutputProducer: Sendable {
    func produce(_ record: KafkaProducerRecord, token: UInt) throws(KafkaError)
}

extension KafkaConsumer: ConsumerControl {}
extension KafkaProducer: OutputProducer {}
