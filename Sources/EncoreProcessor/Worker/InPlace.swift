/// Runs `body` on `value` where it lies: given `&dictionary.values[index]`, the dictionary's modify
/// accessor lends the value. A read through a getter (`dictionary[key]?.field`, `values[index]`)
/// copies it, every buffer it holds retained and then released, which the hot path pays for
/// every record.
@inline(__always)
func inPlace<Value, Result>(_ value: inout Value, _ body: (inout Value) -> Result) -> Result {
    body(&value)
}
