//! llama.cpp's block formats as GGUF stores them: each row of a weight matrix is a run of
//! blocks, each covering 32 consecutive columns.

use std::fmt;

use half::f16;

use super::LinearError;

/// Columns per block (both formats).
pub const BLOCK: usize = 32;

/// A GGUF block format this module multiplies by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// `d: f16, m: f16, qs: [u8; 16]`: `w[j] = d * q[j] + m`, `q[j]` the low nibble of
    /// `qs[j]` for `j < 16`, the high nibble of `qs[j - 16]` after.
    Q4_1,
    /// `d: f16, qs: [i8; 32]`: `w[j] = qs[j] * d`.
    Q8_0,
}

impl BlockFormat {
    /// The format of a GGUF tensor type name (`"Q4_1"`, `"Q8_0"`).
    pub fn from_name(name: &str) -> Result<Self, LinearError> {
        match name {
            "Q4_1" => Ok(Self::Q4_1),
            "Q8_0" => Ok(Self::Q8_0),
            _ => Err(LinearError::UnknownFormat(name.to_string())),
        }
    }

    /// Bytes of one GGUF block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }

    /// The 32 weights of one GGUF block (`raw`: its `block_bytes()`), as gguf-py gives them.
    pub fn dequantize_block(self, raw: &[u8], out: &mut [f32; BLOCK]) {
        let d = f16::from_le_bytes([raw[0], raw[1]]).to_f32();
        match self {
            Self::Q4_1 => {
                let m = f16::from_le_bytes([raw[2], raw[3]]).to_f32();
                for j in 0..16 {
                    let b = raw[4 + j];
                    out[j] = d * f32::from(b & 0x0f) + m;
                    out[j + 16] = d * f32::from(b >> 4) + m;
                }
            }
            Self::Q8_0 => {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = f32::from(raw[2 + j] as i8) * d;
                }
            }
        }
    }
}

impl fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
        })
    }
}
