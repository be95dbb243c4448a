//! GPT-2's byte-to-unicode alphabet, read backwards. Byte-level BPE vocabularies spell every byte
//! as a printable character (a space is `Ġ`, a newline `Ċ`), so a token's raw bytes are found by
//! mapping each character of its text back through this table.

/// Bytes that GPT-2 keeps as their own code point: the printable Latin-1 ranges.
fn is_kept(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Highest code point the alphabet uses: the 68 non-printable bytes are moved to 256..324.
const TABLE_LEN: usize = 256 + 68;

/// GPT-2's byte-level alphabet, both ways: every byte is one printable character (`Ġ` is a
/// space), and `byte_of` is the inverse of GPT-2's `bytes_to_unicode` for code points below 324.
pub struct ByteLevelAlphabet {
    byte_of: [Option<u8>; TABLE_LEN],
    char_of: [char; 256],
}

impl Default for ByteLevelAlphabet {
    fn default() -> Self {
        Self::new()
    }
}

impl ByteLevelAlphabet {
    pub fn new() -> Self {
        let mut byte_of = [None; TABLE_LEN];
        let mut char_of = ['\0'; 256];
        let mut shifted = 256;
        for byte in 0..=255u8 {
            let code_point = if is_kept(byte) {
                byte as usize
            } else {
                shifted += 1;
                shifted - 1
            };
            byte_of[code_point] = Some(byte);
            // Code points below 324 are all valid chars.
            char_of[byte as usize] = char::from_u32(code_point as u32).unwrap_or('\0');
        }
        Self { byte_of, char_of }
    }

    /// The character byte-level vocabularies spell `byte` with.
    pub fn char_of(&self, byte: u8) -> char {
        self.char_of[byte as usize]
    }

    /// Appends the raw bytes a byte-level token text stands for. A character outside the
    /// alphabet (a vocabulary entry that was not byte-encoded) contributes its own UTF-8 bytes,
    /// so odd vocabularies still decode to something readable instead of failing.
    pub fn decode_into(&self, text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match self.byte_of.get(c as usize).copied().flatten() {
                Some(byte) => out.push(byte),
                None => {
                    let mut utf8 = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_characters_map_back_to_their_bytes() {
        let alphabet = ByteLevelAlphabet::new();
        let mut out = Vec::new();
        alphabet.decode_into("Ġhello", &mut out);
        assert_eq!(out, b" hello");
        out.clear();
        alphabet.decode_into("ĊĉĠ", &mut out);
        assert_eq!(out, b"\n\t ");
        out.clear();
        // "é" in UTF-8 is C3 A9; byte-level spells those two bytes as "Ã©".
        alphabet.decode_into("Ã©", &mut out);
        assert_eq!(out, "é".as_bytes());
    }

    #[test]
    fn alphabet_is_a_bijection_over_all_bytes() {
        let alphabet = ByteLevelAlphabet::new();
        let mut seen = [false; 256];
        for b in alphabet.byte_of.iter().flatten() {
            assert!(!seen[*b as usize], "byte {b} mapped twice");
            seen[*b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // The last shifted byte is 0xAD (soft hyphen), at code point 323.
        assert_eq!(alphabet.byte_of[TABLE_LEN - 1], Some(0xAD));
        assert_eq!(alphabet.char_of(0xAD), '\u{143}');
        assert_eq!(alphabet.char_of(b' '), 'Ġ');
        assert_eq!(alphabet.char_of(b'a'), 'a');
    }
}
