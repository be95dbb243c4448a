//! Images in a prompt, as the engine sees them: where each image's tokens are, its pixels as
//! the model's vision tower reads them, and the two rules images add to the engine's.
//!
//! - **Cache keys.** An image's tokens have no token ids: the prompt holds, at each of them, a
//!   key derived from the image's content hash ([`image_keys`], ids with the top bit set, which
//!   no vocabulary reaches). The prefix cache hashes blocks by their ids, so a block holding an
//!   image's tokens is found again only for the same image at the same place, and never for
//!   another image. The model never looks these ids up: it reads the tower's rows there.
//! - **Chunks keep an image whole.** An image's tokens attend to each other (Gemma 3's are
//!   bidirectional), so a prefill chunk never ends inside an image ([`chunk_len`]); it may
//!   start inside one only after a prefix-cache hit, whose blocks were computed with the whole
//!   image.

use std::sync::Arc;

/// The top bit of a prompt id marks an image token's cache key (vocabularies stop far below).
pub const IMAGE_KEY_BIT: u32 = 1 << 31;

/// Whether prompt id `id` is an image token's cache key rather than a token.
pub fn is_image_key(id: u32) -> bool {
    id & IMAGE_KEY_BIT != 0
}

/// The cache keys of an image's `len` tokens: each a function of the image's content hash and
/// the token's place in the image, so that two images share no block and one image's blocks
/// differ from each other.
pub fn image_keys(hash: u64, len: usize) -> impl Iterator<Item = u32> {
    (0..len as u64).map(move |i| {
        // SplitMix64's finalizer over (hash, index): 31 well-mixed bits a token.
        let mut z = hash ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        IMAGE_KEY_BIT | (z as u32 & !IMAGE_KEY_BIT)
    })
}

/// One image of a request's prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptImage {
    /// Its first token's index in the prompt.
    pub start: usize,
    /// Its tokens (the model's tokens per image).
    pub len: usize,
    /// Its content hash (the server's, of the decoded pixels): what its cache keys derive from.
    pub hash: u64,
    /// Its pixels as the model's vision tower reads them (the model's preprocessing, done at
    /// the edge): [`ImageLimits::pixels_per_image`] values.
    pub pixels: Arc<[f32]>,
}

impl PromptImage {
    /// Prompt positions `start..start + len`.
    pub fn span(&self) -> ImageSpan {
        ImageSpan {
            start: self.start,
            end: self.start + self.len,
        }
    }
}

/// Where an image's tokens are in a sequence: positions `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSpan {
    pub start: usize,
    pub end: usize,
}

/// What a model that takes images takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Tokens every image takes in the prompt (the tower's output rows).
    pub tokens_per_image: usize,
    /// Values of an image's preprocessed pixels.
    pub pixels_per_image: usize,
}

/// How many of `wanted` tokens from `start` a prefill chunk takes so that it does not end
/// inside an image of `spans` (sorted, disjoint): `wanted` itself where that ends outside
/// every image; else up to the image's start, or, for a chunk that starts at or inside the
/// image, the rest of the image (or 0, nothing this step, when that is more than `budget`).
pub fn chunk_len(spans: &[ImageSpan], start: usize, wanted: usize, budget: usize) -> usize {
    let end = start + wanted;
    // The image the chunk's end falls strictly inside, if any.
    let Some(span) = spans.iter().find(|s| s.start < end && end < s.end) else {
        return wanted;
    };
    if span.start > start {
        span.start - start
    } else if span.end - start <= budget {
        span.end - start
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_are_marked_and_differ_between_images_and_places() {
        let a: Vec<u32> = image_keys(1, 256).collect();
        let b: Vec<u32> = image_keys(2, 256).collect();
        assert!(a.iter().chain(&b).all(|&k| is_image_key(k)));
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), a.len(), "an image's keys repeat");
        assert_eq!(a, image_keys(1, 256).collect::<Vec<_>>());
        assert!(!is_image_key(262_143));
    }

    #[test]
    fn a_chunk_stops_before_an_image_or_takes_it_whole() {
        let spans = [
            ImageSpan { start: 10, end: 30 },
            ImageSpan { start: 40, end: 50 },
        ];
        assert_eq!(
            chunk_len(&spans, 0, 10, 64),
            10,
            "ends at the image's start"
        );
        assert_eq!(
            chunk_len(&spans, 0, 15, 64),
            10,
            "cut back to the image's start"
        );
        assert_eq!(chunk_len(&spans, 0, 30, 64), 30, "ends at the image's end");
        assert_eq!(
            chunk_len(&spans, 10, 5, 64),
            20,
            "starts at the image: takes it whole"
        );
        assert_eq!(
            chunk_len(&spans, 10, 5, 19),
            0,
            "the image does not fit: nothing"
        );
        assert_eq!(
            chunk_len(&spans, 16, 5, 64),
            14,
            "after a cache hit inside the image"
        );
        assert_eq!(chunk_len(&spans, 0, 45, 64), 40, "the second image");
        assert_eq!(chunk_len(&[], 3, 7, 8), 7);
    }

    proptest! {
        /// Whatever the spans, start and budget: the chunk never ends strictly inside an
        /// image, never exceeds the budget unless it was asked to, and is empty only when the
        /// image it starts in does not fit the budget.
        #[test]
        fn chunks_never_end_inside_an_image(
            gaps in proptest::collection::vec((0usize..20, 1usize..30), 0..5),
            start in 0usize..150,
            wanted in 1usize..100,
            budget in 1usize..100,
        ) {
            let mut spans = Vec::new();
            let mut at = 0;
            for (gap, len) in gaps {
                spans.push(ImageSpan { start: at + gap, end: at + gap + len });
                at += gap + len;
            }
            let wanted = wanted.min(budget);
            let len = chunk_len(&spans, start, wanted, budget);
            let end = start + len;
            prop_assert!(len <= budget);
            if len > 0 {
                prop_assert!(spans.iter().all(|s| !(s.start < end && end < s.end)));
            } else {
                let inside = spans.iter().find(|s| s.start <= start && start < s.end);
                prop_assert!(inside.is_some_and(|s| s.end - start > budget));
            }
        }
    }
}
