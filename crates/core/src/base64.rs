//! Standard base64 with padding (RFC 4648 §4), for the one place tessera needs it:
//! HTTP basic authentication (sent to stores, checked on the telemetry port).
//!
//! ```
//! assert_eq!(tessera_core::base64::encode(b"user:pa55"), "dXNlcjpwYTU1");
//! assert_eq!(tessera_core::base64::decode(b"dXNlcjpwYTU1").as_deref(), Some(&b"user:pa55"[..]));
//! ```

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64, padded with `=` to a multiple of four characters.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, byte)| n | u32::from(*byte) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// The bytes of padded base64 `text`; `None` unless it is a whole number of four-character
/// groups of the alphabet, `=` only at the end.
pub fn decode(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let groups = text.len() / 4;
    for (index, group) in text.chunks(4).enumerate() {
        let padding = group.iter().rev().take_while(|byte| **byte == b'=').count();
        if padding > 2 || (padding > 0 && index + 1 != groups) {
            return None;
        }
        let mut n = 0u32;
        for (i, &byte) in group[..4 - padding].iter().enumerate() {
            let value = ALPHABET.iter().position(|symbol| *symbol == byte)? as u32;
            n |= value << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..4 - padding]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodes_the_rfc_4648_test_vectors() {
        for (text, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::encode(text.as_bytes()), encoded, "{text}");
            assert_eq!(super::decode(encoded.as_bytes()).as_deref(), Some(text.as_bytes()), "{encoded}");
        }
    }

    #[test]
    fn refuses_what_is_not_padded_base64() {
        for bad in ["Zg", "Zg=", "Z===", "Zg==Zm9v", "Zm9!", "Zm 9"] {
            assert_eq!(super::decode(bad.as_bytes()), None, "{bad}");
        }
    }
}
