//! Images a request sends, for vision-language models (issue 72), on every API: where each
//! came from ([`source`]: a `data:` URI's bytes or an http(s) URL), fetched under the
//! server's rules ([`fetch`]: allowed hosts only, no private addresses, a time and a size
//! limit), decoded and checked ([`decode`], against [`limits`]), all of one request at once
//! off the async workers ([`resolve`]); and the marker the chat template sees where each image
//! was ([`marker`]).
//!
//! This room knows nothing of the engine or of the APIs' shapes: each API parses its own
//! parts into [`source::ImageInput`]s, naming the field each came in, and every
//! [`error::MediaError`] becomes a 400 naming that field.

pub mod decode;
pub mod error;
pub mod fetch;
pub mod limits;
pub mod marker;
pub mod resolve;
pub mod source;

pub use decode::DecodedImage;
pub use error::MediaError;
pub use limits::MediaLimits;
pub use marker::{split_at_markers, Piece};
pub use resolve::Media;
pub use source::{Detail, ImageInput, ImageSource};
