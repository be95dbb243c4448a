//! The glue between the HTTP handlers and the engine: a served model ([`served`]) and what
//! handlers share ([`state`]), finding a model by hub name ([`hub`]), loading it ([`load`]),
//! the models served by name with their loads and unloads ([`registry`]), an API's fields made
//! into the engine's request ([`fields`]), requests validated, submitted and their events merged ([`generation`]),
//! log-probabilities in OpenAI's shapes ([`logprobs`]), the LoRA adapters served ([`lora`]), and CPU work kept off the async
//! workers ([`blocking`]). Handlers never touch tensors; this is as close as they get.

pub mod blocking;
pub mod fields;
pub mod generation;
pub mod hub;
pub mod load;
pub mod logprobs;
pub mod lora;
pub mod registry;
pub mod served;
pub mod state;
