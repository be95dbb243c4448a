//! The GGUF block formats the kernels read, and how each is regrouped into quantized panels. A
//! new format is added here (its GGUF block, how a block decodes to small integers and scales,
//! its panel layout) and then taught to each kernel that should read it; a kernel refuses a
//! format it does not handle by returning `None` from its constructor.
//!
//! Every format dequantizes a weight as `s * q`, `s * q + m` or `s * q - m`, where `q` is a
//! small integer, `s` a scale and `m` a minimum, each computed exactly as the reference
//! dequantizer (ggml's, and candle's copy of it) computes them: for the K-quants `s = d * sc`
//! and `m = dmin * mn`, products of an f16 and a 6- or 8-bit integer, which f32 holds exactly.
//! So a kernel that forms `s * q (+/- m)` in f32 gets the reference's weights bit for bit.
//! MXFP4 (gpt-oss's experts) fits the same form: `q` is an E2M1 code's entry of
//! [`E2M1_VALUES`] (llama.cpp's `kvalues_mxfp4`, the values doubled) and `s` the block's
//! E8M0 scale halved ([`e8m0_half`]), a power of two, so `s * q` is exact in f32 too.

/// Weights per block of the legacy formats (Q4_0 .. Q8_0).
pub const BLOCK_WEIGHTS: usize = 32;
/// Weights per super-block of the K-quants.
pub const K_BLOCK_WEIGHTS: usize = 256;
/// Output features per panel: the quantized panels hold 16 columns side by side.
pub const PANEL_COLUMNS: usize = 16;

/// MXFP4's 4-bit E2M1 codes as the integers the kernels multiply: llama.cpp's
/// `kvalues_mxfp4` (`ggml-common.h`), each E2M1 value doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
/// their negatives), the half folded into the scale ([`e8m0_half`]). Code 8 is E2M1's -0,
/// stored here as 0, as llama.cpp stores it: its weight is +0.
pub const E2M1_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An MXFP4 block's E8M0 scale byte `e` halved, `2^(e - 128)`, bit for bit as llama.cpp's
/// `ggml_e8m0_to_fp32_half` (`ggml-impl.h`) forms it: subnormal for `e < 2` (2^-128 and
/// 2^-127), else exponent `e - 1`; `e = 255` (E8M0's NaN) is read as 2^127, as llama.cpp
/// reads it.
#[inline(always)]
pub const fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

/// A GGUF quantization format the kernels read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// f16 scale d, 16 bytes of nibbles: w = (q - 8) * d.
    Q4_0,
    /// f16 scale d and minimum m, 16 bytes of nibbles: w = q * d + m.
    Q4_1,
    /// f16 d, 32 high bits, 16 bytes of low nibbles: w = (q - 16) * d.
    Q5_0,
    /// f16 d and m, 32 high bits, 16 bytes of low nibbles: w = q * d + m.
    Q5_1,
    /// f16 scale d, 32 signed bytes: w = q * d.
    Q8_0,
    /// Super-blocks of 256: f16 d and dmin, 6-bit scale and minimum per 32, nibbles:
    /// w = (d * sc) * q - dmin * mn.
    Q4K,
    /// As Q4_K with a fifth bit per weight.
    Q5K,
    /// Super-blocks of 256: f16 d, 8-bit signed scale per 16, 6-bit quants:
    /// w = (d * sc) * (q - 32).
    Q6K,
    /// OCP microscaling FP4 (GGML type 39, gpt-oss's experts): an E8M0 scale byte `e`, 16
    /// bytes of E2M1 codes (weight `j` in the low nibble of byte `j`, weight `j + 16` in its
    /// high nibble, as Q4_0): `w = E2M1_VALUES[code] * e8m0_half(e)`.
    Mxfp4,
}

/// How a format stores the scale `d` of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleKind {
    /// An f16 (every GGUF format but MXFP4): 2 bytes a column in a panel.
    F16,
    /// An E8M0 byte read as [`e8m0_half`] (MXFP4): 1 byte a column in a panel.
    E8M0,
}

/// How a format's minimum enters a weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinKind {
    /// `w = s * q`.
    None,
    /// `w = s * q + m`, with `m` an f16 per block (Q4_1, Q5_1).
    AddF16,
    /// `w = s * q - dmin * mn`, with an f16 `dmin` per super-block and a 6-bit `mn` per
    /// sub-block (Q4_K, Q5_K).
    SubScaled,
}

/// How a format's blocks are laid out in a quantized panel of [`PANEL_COLUMNS`] columns. Per
/// super-block of `super_rows` k-rows, a panel-block holds: 16 `d` (one per column, f16, or
/// MXFP4's E8M0 bytes: [`ScaleKind`]); 16 f16 `m` or `dmin` unless the format has no minimum; with sub-scales, `super_rows / sub_rows`
/// rows of 16 i8 scales, then as many rows of 16 i8 minimums for [`MinKind::SubScaled`]; then
/// the quants of `super_rows` k-rows x 16 columns: nibbles (two k-rows per byte, the even
/// k-row in the low nibble) or signed bytes holding the final integer `q`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PanelLayout {
    pub super_rows: usize,
    pub sub_rows: usize,
    pub nibbles: bool,
    /// Subtracted from a nibble before it is converted (8 for Q4_0).
    pub nibble_offset: i32,
    /// Whether the scale of a sub-block is `d * sc` (K-quants) rather than `d`.
    pub sub_scales: bool,
    pub min: MinKind,
    /// How the 16 `d` are stored.
    pub scale: ScaleKind,
    /// Whether a nibble is an E2M1 code whose integer is its [`E2M1_VALUES`] entry (MXFP4)
    /// rather than the nibble less `nibble_offset`.
    pub e2m1: bool,
}

impl PanelLayout {
    pub const fn subs(self) -> usize {
        self.super_rows / self.sub_rows
    }

    /// Bytes of the 16 scales `d` at the start of a panel-block.
    pub const fn d_bytes(self) -> usize {
        match self.scale {
            ScaleKind::F16 => 32,
            ScaleKind::E8M0 => 16,
        }
    }

    /// Offset of the f16 minimums (or `dmin`).
    pub const fn min_at(self) -> usize {
        self.d_bytes()
    }

    /// Offset of the sub-block scales.
    pub const fn scales_at(self) -> usize {
        match self.min {
            MinKind::None => self.d_bytes(),
            _ => self.d_bytes() + 32,
        }
    }

    /// Offset of the sub-block minimums.
    pub const fn mins_at(self) -> usize {
        self.scales_at() + if self.sub_scales { self.subs() * 16 } else { 0 }
    }

    /// Offset of the quants.
    pub const fn quants_at(self) -> usize {
        self.mins_at()
            + match self.min {
                MinKind::SubScaled => self.subs() * 16,
                _ => 0,
            }
    }

    /// Bytes of one panel-block: 16 columns x `super_rows` k-rows.
    pub const fn block_bytes(self) -> usize {
        self.quants_at()
            + if self.nibbles {
                self.super_rows / 2 * 16
            } else {
                self.super_rows * 16
            }
    }
}

/// One GGUF block decoded to the integers and raw f16 scales a weight is computed from.
#[derive(Debug, Clone)]
pub struct DecodedBlock {
    /// f16 bits of `d`; MXFP4's E8M0 byte ([`QuantFormat::scale`] reads either).
    pub d: u16,
    /// f16 bits of `m` or `dmin` (0 without a minimum).
    pub m: u16,
    /// Sub-block scales and minimums (K-quants).
    pub sc: [i8; 16],
    pub mn: [i8; 16],
    /// The integers `q`, nibble offset not applied (it is applied when a weight is formed);
    /// MXFP4's E2M1 codes, not yet read through [`E2M1_VALUES`].
    pub q: [i8; K_BLOCK_WEIGHTS],
}

impl QuantFormat {
    /// Every format, for tests and for listing what is supported.
    pub const ALL: [Self; 9] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Mxfp4,
    ];

    /// The formats of 32-weight blocks with nibbles or bytes and one f16 scale, which the
    /// specialised AVX-512, AMX and int8-dot kernels read.
    pub const fn is_legacy_layout(self) -> bool {
        matches!(self, Self::Q4_0 | Self::Q4_1 | Self::Q8_0)
    }

    /// The K-quants: super-blocks of 256 weights with per-sub-block integer scales.
    pub const fn is_k_quant(self) -> bool {
        matches!(self, Self::Q4K | Self::Q5K | Self::Q6K)
    }

    /// Const-generic ids, so a kernel can be specialised per format at compile time.
    pub(crate) const Q4_0_ID: u8 = 0;
    pub(crate) const Q4_1_ID: u8 = 1;
    pub(crate) const Q8_0_ID: u8 = 2;
    pub(crate) const Q5_0_ID: u8 = 3;
    pub(crate) const Q5_1_ID: u8 = 4;
    pub(crate) const Q4K_ID: u8 = 5;
    pub(crate) const Q5K_ID: u8 = 6;
    pub(crate) const Q6K_ID: u8 = 7;
    pub(crate) const MXFP4_ID: u8 = 8;

    pub(crate) const fn from_id(id: u8) -> Self {
        match id {
            Self::Q4_0_ID => Self::Q4_0,
            Self::Q4_1_ID => Self::Q4_1,
            Self::Q8_0_ID => Self::Q8_0,
            Self::Q5_0_ID => Self::Q5_0,
            Self::Q5_1_ID => Self::Q5_1,
            Self::Q4K_ID => Self::Q4K,
            Self::Q5K_ID => Self::Q5K,
            Self::MXFP4_ID => Self::Mxfp4,
            _ => Self::Q6K,
        }
    }

    /// The GGUF name of the format, as error messages and logs give it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Mxfp4 => "MXFP4",
        }
    }

    /// Weights per GGUF block.
    pub const fn block_weights(self) -> usize {
        match self {
            _ if self.is_k_quant() => K_BLOCK_WEIGHTS,
            _ => BLOCK_WEIGHTS,
        }
    }

    /// Bytes of one GGUF block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Mxfp4 => 17,
        }
    }

    /// The scale `d` of a decoded block as f32: its f16, or MXFP4's [`e8m0_half`].
    pub fn scale(self, b: &DecodedBlock) -> f32 {
        match self {
            Self::Mxfp4 => e8m0_half(b.d as u8),
            _ => half::f16::from_bits(b.d).to_f32(),
        }
    }

    /// Whether the block holds an f16 minimum after its scale (legacy formats).
    pub const fn has_min(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1)
    }

    /// Offset of the quants in a legacy GGUF block.
    pub const fn quants_offset(self) -> usize {
        match self {
            Self::Mxfp4 => 1,
            _ if self.has_min() => 4,
            _ => 2,
        }
    }

    pub const fn panel_layout(self) -> PanelLayout {
        let legacy = PanelLayout {
            super_rows: BLOCK_WEIGHTS,
            sub_rows: BLOCK_WEIGHTS,
            nibbles: false,
            nibble_offset: 0,
            sub_scales: false,
            min: MinKind::None,
            scale: ScaleKind::F16,
            e2m1: false,
        };
        let k = PanelLayout {
            super_rows: K_BLOCK_WEIGHTS,
            sub_rows: 32,
            sub_scales: true,
            ..legacy
        };
        match self {
            Self::Q4_0 => PanelLayout {
                nibbles: true,
                nibble_offset: 8,
                ..legacy
            },
            Self::Q4_1 => PanelLayout {
                nibbles: true,
                min: MinKind::AddF16,
                ..legacy
            },
            // Five bits do not pack into nibbles: one signed byte per weight, `q - 16`.
            Self::Q5_0 | Self::Q8_0 => legacy,
            Self::Q5_1 => PanelLayout {
                min: MinKind::AddF16,
                ..legacy
            },
            Self::Q4K => PanelLayout {
                nibbles: true,
                min: MinKind::SubScaled,
                ..k
            },
            Self::Q5K => PanelLayout {
                min: MinKind::SubScaled,
                ..k
            },
            Self::Q6K => PanelLayout { sub_rows: 16, ..k },
            Self::Mxfp4 => PanelLayout {
                nibbles: true,
                scale: ScaleKind::E8M0,
                e2m1: true,
                ..legacy
            },
        }
    }

    /// Dequantizes whole GGUF blocks of the format into `out` (as many weights as the blocks
    /// hold), each weight formed as the reference forms it ([`weight`] of the block's integer,
    /// scale and minimum; the K-quants' `d * sc` and `dmin * mn` in f32): the values every
    /// kernel of the format multiplies by. For MXFP4 this is llama.cpp's
    /// `dequantize_row_mxfp4` bit for bit: `E2M1_VALUES[code] * e8m0_half(e)`, one exact
    /// product.
    ///
    /// # Panics
    /// When `src` is not whole blocks or `out` not their weights.
    pub fn dequantize(self, src: &[u8], out: &mut [f32]) {
        let (gb, bw) = (self.block_bytes(), self.block_weights());
        assert!(src.len().is_multiple_of(gb), "whole {} blocks", self.name());
        assert_eq!(out.len(), src.len() / gb * bw, "one weight per output");
        let layout = self.panel_layout();
        for (blk, out) in src.chunks_exact(gb).zip(out.chunks_exact_mut(bw)) {
            let b = self.decode(blk);
            let d = self.scale(&b);
            let m = half::f16::from_bits(b.m).to_f32();
            for (sub, out) in out.chunks_exact_mut(layout.sub_rows).enumerate() {
                // The sub-block scales and minimums are at most 63 (Q6_K's scales signed).
                let (s, m) = if layout.sub_scales {
                    (d * b.sc[sub] as f32, m * b.mn[sub] as f32)
                } else {
                    (d, m)
                };
                for (i, o) in out.iter_mut().enumerate() {
                    *o = weight(layout, b.q[sub * layout.sub_rows + i], s, m);
                }
            }
        }
    }

    /// Decodes one GGUF block (`src` is [`Self::block_bytes`] long) into its integers, in the
    /// order of the block's weights, and its raw scales.
    pub fn decode(self, src: &[u8]) -> DecodedBlock {
        assert_eq!(src.len(), self.block_bytes(), "one {} block", self.name());
        let f16_at = |at: usize| u16::from_le_bytes([src[at], src[at + 1]]);
        let mut b = DecodedBlock {
            d: f16_at(0),
            m: 0,
            sc: [0; 16],
            mn: [0; 16],
            q: [0; K_BLOCK_WEIGHTS],
        };
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Mxfp4 => {
                let qs = &src[self.quants_offset()..];
                if self.has_min() {
                    b.m = f16_at(2);
                }
                if self == Self::Mxfp4 {
                    b.d = src[0] as u16;
                }
                for (j, &byte) in qs[..16].iter().enumerate() {
                    b.q[j] = (byte & 0x0F) as i8;
                    b.q[j + 16] = (byte >> 4) as i8;
                }
            }
            Self::Q5_0 | Self::Q5_1 => {
                let (qh_at, offset) = if self == Self::Q5_1 {
                    b.m = f16_at(2);
                    (4, 0)
                } else {
                    (2, 16)
                };
                let qh = u32::from_le_bytes(src[qh_at..qh_at + 4].try_into().expect("4 bytes"));
                let qs = &src[qh_at + 4..];
                for (j, &byte) in qs[..16].iter().enumerate() {
                    let h0 = ((qh >> j) & 1) as u8;
                    let h1 = ((qh >> (j + 16)) & 1) as u8;
                    b.q[j] = ((byte & 0x0F) | (h0 << 4)) as i8 - offset;
                    b.q[j + 16] = ((byte >> 4) | (h1 << 4)) as i8 - offset;
                }
            }
            Self::Q8_0 => {
                for j in 0..32 {
                    b.q[j] = src[2 + j] as i8;
                }
            }
            Self::Q4K | Self::Q5K => {
                b.m = f16_at(2);
                let scales = &src[4..16];
                for i in 0..8 {
                    let (sc, mn) = k_scale_min(i, scales);
                    b.sc[i] = sc as i8;
                    b.mn[i] = mn as i8;
                }
                let (qs, qh) = if self == Self::Q5K {
                    (&src[48..176], Some(&src[16..48]))
                } else {
                    (&src[16..144], None)
                };
                // 64 weights per 32 bytes: the low nibbles, then the high ones; Q5_K's fifth
                // bits are bit 2c (low half) and 2c+1 (high half) of qh[i].
                for c in 0..4 {
                    for i in 0..32 {
                        let byte = qs[32 * c + i];
                        let (mut lo, mut hi) = (byte & 0x0F, byte >> 4);
                        if let Some(qh) = qh {
                            lo |= ((qh[i] >> (2 * c)) & 1) << 4;
                            hi |= ((qh[i] >> (2 * c + 1)) & 1) << 4;
                        }
                        b.q[64 * c + i] = lo as i8;
                        b.q[64 * c + 32 + i] = hi as i8;
                    }
                }
            }
            Self::Q6K => {
                let (ql, qh, sc) = (&src[..128], &src[128..192], &src[192..208]);
                b.d = f16_at(208);
                for (i, &s) in sc.iter().enumerate() {
                    b.sc[i] = s as i8;
                }
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    let q = &mut b.q[128 * half..];
                    for l in 0..32 {
                        q[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                        q[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                        q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                        q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                    }
                }
            }
        }
        b
    }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K/Q5_K block's 12 scale bytes.
fn k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The weight of integer `q` under scale `s` and minimum `m`, formed as the kernels form it
/// (one rounding for the product, one for the minimum).
#[inline(always)]
pub fn weight(layout: PanelLayout, q: i8, s: f32, m: f32) -> f32 {
    let q = if layout.e2m1 {
        E2M1_VALUES[q as usize & 0x0F] as i32
    } else if layout.nibbles {
        q as i32 - layout.nibble_offset
    } else {
        q as i32
    };
    let w = q as f32 * s;
    match layout.min {
        MinKind::None => w,
        MinKind::AddF16 => w + m,
        MinKind::SubScaled => w - m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a hex string.
    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// MXFP4 blocks dequantize to the `gguf` package's reference values bit for bit (the
    /// fixture: `scripts/mxfp4-fixture.py`): quantized blocks, subnormal scales, E8M0's edges
    /// (255's codes of +-12 overflowing to infinity, as in llama.cpp) and every code.
    #[test]
    fn mxfp4_dequantizes_as_the_gguf_reference() {
        let fixture = include_str!("../tests/fixtures/mxfp4.txt");
        let mut blocks = 0;
        for line in fixture.lines().filter(|l| !l.starts_with('#')) {
            let mut fields = line.split_whitespace();
            let block = hex(fields.next().expect("block bytes"));
            let want: Vec<u32> = fields
                .map(|f| u32::from_str_radix(f, 16).expect("f32 bits"))
                .collect();
            assert_eq!((block.len(), want.len()), (17, 32), "a fixture line");
            let mut got = [0f32; 32];
            QuantFormat::Mxfp4.dequantize(&block, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    *w,
                    "block {line:.34}: weight {i}: {g} vs {}",
                    f32::from_bits(*w)
                );
            }
            blocks += 1;
        }
        assert!(blocks >= 40, "the fixture's blocks were read ({blocks})");
    }

    #[test]
    fn e8m0_halves_are_llama_cpps() {
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        for e in 2..=255u8 {
            assert_eq!(e8m0_half(e), 2f32.powi(e as i32 - 128), "e = {e}");
        }
    }
}
