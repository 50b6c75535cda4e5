//! Lower-case hex, for bytes kept in text (checkpoints, resume tokens, ids in logs).

/// `bytes` as lower-case hex, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// The bytes of a hex string (either case). The error names the first bad pair.
pub fn decode(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!("{hex:?} is not hex: odd length {}", hex.len()));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("{hex:?} is not hex: bad digits at offset {i}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_bad_input() {
        let all: Vec<u8> = (0..=255).collect();
        let h = encode(&all);
        assert_eq!(&h[..6], "000102");
        assert_eq!(&h[h.len() - 4..], "feff");
        assert_eq!(decode(&h).unwrap(), all);
        assert_eq!(decode("ABcd").unwrap(), vec![0xab, 0xcd]);
        assert_eq!(decode("").unwrap(), Vec::<u8>::new());
        assert!(decode("abc").unwrap_err().contains("odd length 3"));
        assert!(decode("00zz").unwrap_err().contains("offset 2"));
        // A multi-byte character is refused, not split.
        assert!(decode("0é").is_err());
    }
}
