import COpenSSL

/// HMAC-SHA256 through OpenSSL's libcrypto.
enum HMACSHA256 {
    static func digest(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let done = key.withUnsafeBufferPointer { key in
            message.withUnsafeBufferPointer { message in
                HMAC(
                    EVP_sha256(), key.baseAddress, Int32(key.count), message.baseAddress, message.count, &output,
                    &length)
            }
        }
        precondition(done != nil && length == 32, "HMAC-SHA256 failed")
        return Array(output.prefix(Int(length)))
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text = [UInt8]()
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}
