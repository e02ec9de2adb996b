import Kafka

/// The W3C trace context of a request record: `traceparent`, else CloudEvents' `ce_traceparent`,
/// and the same for `tracestate`. Read once per record (a work item keeps it), in one pass over
/// its headers: the call and every output of the request use it.
struct TraceContext: Sendable {
    var parent: String?
    var state: String?

    init(_ headers: [KafkaHeader]) {
        guard !headers.isEmpty else { return }
        var (parent, state, ceParent, ceState): (String?, String?, String?, String?) = (nil, nil, nil, nil)
        for header in headers {
            switch header.key {
            case "traceparent": parent = parent ?? header.stringValue
            case "tracestate": state = state ?? header.stringValue
            case "ce_traceparent": ceParent = ceParent ?? header.stringValue
            case "ce_tracestate": ceState = ceState ?? header.stringValue
            default: continue
            }
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
