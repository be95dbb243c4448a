//! Images in: the vision tower of a multimodal model, read from llama.cpp's projector GGUF
//! files (`--mmproj`), turning images into embeddings that take the place of the text model's
//! token embeddings at an image's positions.
//!
//! - [`mmproj`]: the file's `clip.*` keys and tensors into a [`VisionSpec`] and the tower's
//!   weights; every missing key or tensor, wrong shape or unknown projector type is a
//!   [`VisionError`] naming it, at open.
//! - [`preprocess`]: RGB8 pixels of any size into the tower's square of f32 values, with
//!   llama.cpp's arithmetic to the bit (its Pillow-style bilinear resize, letterbox and
//!   normalisation). Pure: any thread may call it.
//! - [`siglip`]: the SigLIP encoder and Gemma 3's projector (pooling, RMSNorm, projection),
//!   every image of a call in one batched forward; `attention` the encoder's bidirectional
//!   attention within each image.
//!
//! Gemma 3's tower (`clip.projector_type` = `gemma3`) is the one projector read so far; any
//! other type is refused by name. The oracle is llama.cpp (tools/mtmd/clip.cpp,
//! models/siglip.cpp) through the numpy reference `scripts/vision-ref.py`
//! (`tests/vision.rs`).

mod attention;
pub mod mmproj;
pub mod preprocess;
pub mod siglip;

pub use mmproj::{ProjectorKind, VisionError, VisionSpec};
pub use preprocess::{normalize, preprocess, resize_to_square};
pub use siglip::VisionTower;
