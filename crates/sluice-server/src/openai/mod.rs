//! OpenAI API bodies: what clients send and what they get back. Plain data; the mapping onto
//! engine requests lives in [`crate::engine::fields`], the validation in the engine.

use std::collections::HashMap;

pub use common::{Prompt, Seed, StopList, StreamOptions, Usage};

/// Hands the sampling and stopping fields the two generation endpoints share, listed once
/// here, to the macro `$m` after its own tokens `$args`. Adding such a field means one line
/// here (then the engine's parameter in [`crate::engine::fields::request`]).
macro_rules! with_sampling_fields {
    ($m:ident! $args:tt) => {
        $m! { $args
            temperature: Option<f64>,
            top_p: Option<f64>,
            n: Option<usize>,
            stop: Option<StopList>,
            seed: Option<Seed>,
            presence_penalty: Option<f64>,
            frequency_penalty: Option<f64>,
            logit_bias: Option<HashMap<String, f64>>,
            // vLLM's and llama.cpp's extensions.
            top_k: Option<i64>,
            min_p: Option<f64>,
            top_n_sigma: Option<f64>,
            repetition_penalty: Option<f64>,
            ignore_eos: Option<bool>,
            min_tokens: Option<usize>,
            stop_token_ids: Option<Vec<u32>>,
            skip_special_tokens: Option<bool>,
            include_stop_str_in_output: Option<bool>,
        }
    };
}

/// A generation request body: the struct as written, plus the shared fields
/// ([`with_sampling_fields`]) as plain fields of its own, and `sampling()` copying them out.
/// Plain fields, not a `#[serde(flatten)]`ed struct: flattening loses the field path of a
/// type error (`"n": -1` would no longer answer with `param: "n"`), which clients rely on.
macro_rules! generation_request {
    ({ $(#[$attr:meta])* pub struct $name:ident { $($own:tt)* } }
     $($(#[$fattr:meta])* $field:ident : $ty:ty,)*) => {
        $(#[$attr])*
        pub struct $name {
            $($own)*
            $($(#[$fattr])* pub $field: $ty,)*
        }

        impl $name {
            /// The sampling and stopping fields, for [`crate::engine::fields::request`].
            pub fn sampling(&self) -> $crate::openai::SamplingFields {
                $crate::openai::SamplingFields {
                    $($field: self.$field.clone(),)*
                }
            }
        }
    };
}

macro_rules! sampling_fields_struct {
    ({} $($(#[$fattr:meta])* $field:ident : $ty:ty,)*) => {
        /// The sampling and stopping fields the two generation endpoints share; the other APIs
        /// fill the few they have.
        #[derive(Debug, Clone, Default)]
        pub struct SamplingFields {
            $(pub $field: $ty,)*
        }
    };
}

with_sampling_fields!(sampling_fields_struct! {});

pub mod chat;
pub mod common;
pub mod completions;
pub mod content;
pub mod embeddings;
pub mod render;
pub mod structured;
pub mod tokenize;
