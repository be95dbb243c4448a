//! The GGUF block formats the kernels read in place. A new format is added here (its block
//! size and bytes) and then taught to each kernel that should read it; a kernel refuses a
//! format it does not handle by returning `None` from its constructor.

/// Weights per GGUF block of the formats below.
pub const BLOCK_WEIGHTS: usize = 32;

/// A GGUF quantization format: blocks of [`BLOCK_WEIGHTS`] weights with an f16 scale (and, for
/// Q4_1, an f16 minimum). Every kernel dequantizes a weight with the reference arithmetic
/// (`q * d`, `q * d + m`, `(q - 8) * d`), so products equal those of the dequantized f32
/// weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// f16 scale d, 16 bytes of nibbles: w = d * (q - 8).
    Q4_0,
    /// f16 scale d and minimum m, 16 bytes of nibbles: w = d * q + m.
    Q4_1,
    /// f16 scale d, 32 signed bytes: w = d * q.
    Q8_0,
}

impl QuantFormat {
    /// Every format, for tests and for listing what is supported.
    pub const ALL: [Self; 3] = [Self::Q4_0, Self::Q4_1, Self::Q8_0];

    /// Const-generic ids, so a kernel can be specialised per format at compile time.
    pub(crate) const Q4_0_ID: u8 = 0;
    pub(crate) const Q4_1_ID: u8 = 1;
    pub(crate) const Q8_0_ID: u8 = 2;

    pub(crate) const fn id(self) -> u8 {
        match self {
            Self::Q4_0 => Self::Q4_0_ID,
            Self::Q4_1 => Self::Q4_1_ID,
            Self::Q8_0 => Self::Q8_0_ID,
        }
    }

    /// Bytes of one GGUF block of [`BLOCK_WEIGHTS`] weights.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }

    /// Whether the block holds an f16 minimum after its scale.
    pub const fn has_min(self) -> bool {
        matches!(self, Self::Q4_1)
    }

    /// Offset of the quants in a GGUF block.
    pub const fn quants_offset(self) -> usize {
        if self.has_min() {
            4
        } else {
            2
        }
    }
}
