import Kafka

/// The W3C trace context of a request record: `traceparent`, else CloudEvents' `ce_traceparent`,
/// and the same for `tracestate`. Read once per record (a work item keeps it), in one pass over
/// its headers: the call and every output of the request use it.
struct TraceContext: Sendable {
    var parent: String?
    var state: String?

    /// No context.
    init() {}

    /// Read from the headers' bytes: no string is made but of the context's own values.
    init(_ headers: borrowing KafkaHeaderBuffer) {
        guard !headers.isEmpty else { return }
        var (parent, state, ceParent, ceState): (String?, String?, String?, String?) = (nil, nil, nil, nil)
        headers.forEach { key, value in
            // Every name looked for ends in "parent" or "state", after an optional "ce_".
            guard key.count >= 10, key.count <= 14, let value else { return }
            func take(_ wanted: StaticString, _ slot: inout String?) {
                guard slot == nil, wanted.withUTF8Buffer({ key.elementsEqual($0) }) else { return }
                slot = String(validating: value, as: UTF8.self)
            }
            take("traceparent", &parent)
            take("tracestate", &state)
            take("ce_traceparent", &ceParent)
            take("ce_tracestate", &ceState)
        }
        self.parent = parent ?? ceParent
        self.state = state ?? ceState
    }

    /// The headers an output carries: `traceparent`/`tracestate` and CloudEvents'
    /// `ce_traceparent`/`ce_tracestate` (none without a context: no array is allocated).
    var headers: [KafkaHeader] {
        var copied: [KafkaHeader] = []
        if let parent {
            copied += [
                KafkaHeader(key: "traceparent", string: parent), KafkaHeader(key: "ce_traceparent", string: parent),
            ]
        }
        if let state {
            copied += [KafkaHeader(key: "tracestate", string: state), KafkaHeader(key: "ce_tracestate", string: state)]
        }
        return copied
    }
}
