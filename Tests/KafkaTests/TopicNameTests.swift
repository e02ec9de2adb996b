import Testing

@testable import Kafka

@Suite("A consumed batch's topic name, one String a batch")
struct TopicNameTests {
    /// Raw bits of a string: equal only when both share one storage (or are the same small string).
    static func bits(_ text: String) -> [UInt8] { withUnsafeBytes(of: text) { Array($0) } }

    @Test("the same name gives the cached String itself; another name a new one, then cached; no name is '?'")
    func reusesTheCachedName() {
        var cached: String? = nil
        let first = KafkaConsumer.topicName("encore.purchase-requests", reusing: &cached)
        #expect(first == "encore.purchase-requests")
        let again = KafkaConsumer.topicName("encore.purchase-requests", reusing: &cached)
        #expect(again == first && Self.bits(again) == Self.bits(first), "the cached storage, not a new string")
        let prefix = KafkaConsumer.topicName("encore.purchase-request", reusing: &cached)
        #expect(prefix == "encore.purchase-request", "a name that is a prefix of the cached one is another name")
        let longer = KafkaConsumer.topicName("encore.purchase-requests.v2", reusing: &cached)
        #expect(longer == "encore.purchase-requests.v2")
        #expect(cached == "encore.purchase-requests.v2")
        #expect(KafkaConsumer.topicName(nil, reusing: &cached) == "?")
        #expect(cached == "encore.purchase-requests.v2", "no name leaves the cache as it was")
    }
}
