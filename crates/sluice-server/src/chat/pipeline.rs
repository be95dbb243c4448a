//! One conversation through the chat pipeline, whichever API it came in by (chat completions,
//! Anthropic's Messages, the Responses API): the tools planned ([`crate::chat::tools`]), the one
//! output grammar chosen (a forced call's or the request's format, [`crate::chat::grammar`]),
//! the images checked against the model and decoded ([`crate::media`]), the template rendered
//! (a marker where each image was) and tokenized off the async workers, and the sequences
//! submitted.
//! What comes back is read by [`crate::chat::output`], as a stream or collected here whole.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use sluice_engine::{FinishEvent, FinishReason, PromptImage, Request, TokenEvent};
use sluice_tokenizer::tool_parser::ToolCallFormat;
use sluice_tokenizer::ChatTemplate;

use crate::chat::grammar::RequestedGrammar;
use crate::chat::output::{ChoiceOutput, OutputFormat};
use crate::chat::template;
use crate::chat::tools::{self, ToolPlan};
use crate::edge::error::{ApiError, ParamNames};
use crate::engine::blocking::tokenize_blocking;
use crate::engine::generation::{self, Generation, Item};
use crate::engine::state::{AppState, ServedModel};
use crate::media::marker::{split_checked, Piece};
use crate::media::{DecodedImage, ImageInput, Media};
use crate::openai::chat::ChatMessageIn;
use crate::openai::structured::{ToolCallOut, ToolChoice};

/// A conversation and how to continue it, in chat completions' terms (the other APIs
/// translate theirs into this).
pub struct ChatJob {
    /// Its images are in their messages' content, in order ([`ChatJob::images`]), each
    /// naming the field it came in; [`prepare`] decodes them.
    pub messages: Vec<ChatMessageIn>,
    /// As the client sent them (chat completions' shape); checked by [`tools::plan`].
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// The output format the request's own field asks for.
    pub requested: Option<RequestedGrammar>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// The engine's request as the endpoint's fields set it ([`crate::engine::fields::request`]);
    /// [`prepare`] gives it its prompt and constraint.
    pub request: Request,
    /// What the endpoint calls the fields the engine's errors name.
    pub names: ParamNames,
}

impl ChatJob {
    /// The conversation's images, in the order the rendered prompt's markers stand for them.
    pub fn images(&self) -> impl Iterator<Item = &ImageInput> {
        conversation_images(&self.messages)
    }
}

fn conversation_images(messages: &[ChatMessageIn]) -> impl Iterator<Item = &ImageInput> {
    messages.iter().flat_map(|m| m.content.images())
}

/// A conversation submitted: its sequences, and how their text is to be read.
pub struct ChatRun {
    pub generation: Generation,
    pub output: OutputFormat,
}

/// Plans, renders, tokenizes and submits `job` ([`prepare`], then the engine's checks and
/// submission). Every way it can be wrong is a 400 naming the field (as chat completions names
/// it; the caller's translation keeps those names where the API shares them).
pub async fn start(
    state: &AppState,
    model: Arc<ServedModel>,
    job: ChatJob,
    id: String,
    endpoint: &'static str,
    started: Instant,
) -> Result<ChatRun, ApiError> {
    let PreparedChat {
        request,
        output,
        names,
        ..
    } = prepare(&model, state.media(), job).await?;
    let generation = Generation::start(state, model, id, endpoint, started, vec![request], &names)?;
    Ok(ChatRun { generation, output })
}

/// A conversation planned, rendered and tokenized, not yet checked against the engine's
/// limits ([`crate::engine::generation::validate`] does that): what [`start`] submits, and what
/// `POST /v1/chat/completions/render` shows.
pub struct PreparedChat {
    /// The template's text: the conversation, the tools as the template shows them, and the
    /// opening of the assistant's turn; [`crate::media::marker::marker`] where each image is
    /// ([`crate::media::split_at_markers`] cuts it there).
    pub text: String,
    /// The engine's request: its prompt the text's tokens (each image the positions the
    /// model gives it, [`tokenize`]), its images preprocessed for the model's tower, its
    /// constraint the output grammar.
    pub request: Request,
    /// How the output is to be read (reasoning, tool calls).
    pub output: OutputFormat,
    pub names: ParamNames,
}

/// Plans the tools, chooses the one output grammar and compiles it, checks and decodes the
/// images (with `media`'s limits), renders the template and tokenizes it (off the async
/// workers).
pub async fn prepare(
    model: &Arc<ServedModel>,
    media: &Media,
    job: ChatJob,
) -> Result<PreparedChat, ApiError> {
    let ChatJob {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls,
        requested,
        chat_template_kwargs,
        mut request,
        names,
    } = job;
    check_images(model, &messages)?;
    let plan = plan_tools(model, tools, tool_choice, parallel_tool_calls)?;
    // Fetched and decoded once the request is otherwise known to be good.
    let images: Vec<&ImageInput> = conversation_images(&messages).collect();
    let images = media.resolve(&images).await?;
    let image_count = images.len();
    // A Harmony model's whole output is read by channel, whether or not it may call tools.
    let harmony = model
        .chat_template
        .as_ref()
        .is_some_and(|t| t.tool_call_format() == ToolCallFormat::Harmony);
    // An asked-for response format wins: its JSON is the answer, never a bare call.
    let bare_calls = plan.bare_calls.clone().filter(|_| requested.is_none());
    let grammar = match (plan.grammar.clone(), requested) {
        (Some(_), Some(r)) => {
            return Err(ApiError::invalid(
                r.param,
                "the output cannot follow a format and the tools' call grammar at once (a \
                 forced call, or strict tools); drop one of them.",
            ))
        }
        (Some(forced), None) => Some((forced, "tools")),
        // A Harmony model answers on its `final` channel, so the format follows its opening.
        (None, Some(r)) if harmony => Some((r.grammar.harmony_answer(), r.param)),
        (None, Some(r)) => Some((r.grammar, r.param)),
        (None, None) => None,
    };
    let output_format = plan.format.or(harmony.then_some(ToolCallFormat::Harmony));
    if matches!(
        output_format,
        Some(ToolCallFormat::Llama3Json | ToolCallFormat::Mistral | ToolCallFormat::Harmony)
    ) {
        // These formats mark calls (and Harmony its channels) with control tokens
        // (`<|python_tag|>`, `[TOOL_CALLS]`, `<|channel|>`), which the parser must see.
        request.stop.skip_special_tokens = false;
    }
    let thinks = model.chat_template.as_ref().is_some_and(|t| t.thinks());

    let render_model = model.clone();
    let template_tools = plan.template_tools.clone();
    let (text, prompt, images, opens_thinking, constraint) = tokenize_blocking(move || {
        let (text, prompt, starts) = render_prompt(
            &render_model,
            &messages,
            image_count,
            template_tools.as_deref(),
            chat_template_kwargs.as_ref(),
        )?;
        let images = prompt_images(&render_model, images, &starts)?;
        let opens_thinking = ChatTemplate::prompt_opens_thinking(&text);
        let constraint = grammar
            .map(|(g, param)| render_model.compile_constraint(g, param))
            .transpose()?;
        Ok((text, prompt, images, opens_thinking, constraint))
    })
    .await?;
    request.prompt = prompt;
    request.images = images;
    request.constraint = constraint;
    Ok(PreparedChat {
        text,
        request,
        output: OutputFormat {
            reasoning: thinks.then_some(opens_thinking),
            tools: output_format,
            single_call: plan.single_call,
            bare_calls,
        },
        names,
    })
}

/// Refuses images, naming the first, when the model reads text only.
fn check_images(model: &ServedModel, messages: &[ChatMessageIn]) -> Result<(), ApiError> {
    match conversation_images(messages).next() {
        Some(image) if model.image_input.is_none() => Err(ApiError::invalid(
            image.field.clone(),
            format!(
                "the model `{}` reads text only; it takes no images.",
                model.name
            ),
        )),
        _ => Ok(()),
    }
}

/// The tools planned for `model` ([`tools::plan`]); none without a chat template, whose
/// rendering refuses the request, naming `messages`.
fn plan_tools(
    model: &ServedModel,
    tools: Option<Vec<Value>>,
    tool_choice: Option<ToolChoice>,
    parallel_tool_calls: Option<bool>,
) -> Result<ToolPlan, ApiError> {
    let Some(template) = model.chat_template.as_ref() else {
        return Ok(ToolPlan::default());
    };
    let mut plan = tools::plan(
        tools,
        tool_choice,
        parallel_tool_calls,
        template,
        model.tool_call_format,
    )?;
    if template.tool_call_format() == ToolCallFormat::Harmony {
        // gpt-oss's template writes `"// " + tool.description` unguarded, which fails on a
        // tool without one (OpenAI makes it optional): such a tool is described as empty.
        for tool in plan.template_tools.iter_mut().flatten() {
            if let Some(Value::Object(function)) = tool.get_mut("function") {
                function
                    .entry("description")
                    .or_insert_with(|| Value::String(String::new()));
            }
        }
    }
    Ok(plan)
}

/// The conversation rendered with the model's template (ending with the assistant's turn),
/// each of its `images` a marker, its tokens ([`tokenize`]) and where each image's positions
/// start in them. The template writes any BOS the model wants itself.
fn render_prompt(
    model: &ServedModel,
    messages: &[ChatMessageIn],
    images: usize,
    template_tools: Option<&[Value]>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<(String, Vec<u32>, Vec<usize>), ApiError> {
    let text = template::render_chat_with_images(
        model.chat_template.as_ref(),
        messages,
        true,
        template_tools,
        kwargs,
    )?;
    let (prompt, starts) = tokenize(model, &text, images)?;
    Ok((text, prompt, starts))
}

/// The tokens of a rendered prompt, and where each image's positions start. Without images,
/// the text's tokens. With them, the sequence llama.cpp's mtmd builds
/// (`tests/fixtures/vision/README.md`): the text cut at its markers, each piece tokenized on
/// its own (no token spans an image), and each image the model's opening token, its
/// `tokens_per_image` positions (placeholders here: the engine writes the image's cache keys
/// there) and its closing token.
fn tokenize(
    model: &ServedModel,
    text: &str,
    images: usize,
) -> Result<(Vec<u32>, Vec<usize>), ApiError> {
    let encode = |piece: &str| {
        model
            .tokenizer()
            .encode(piece)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))
    };
    if images == 0 {
        return Ok((encode(text)?, Vec::new()));
    }
    let spec = model.image_input.as_ref().ok_or_else(|| {
        ApiError::internal("images for a model that takes none got past the check")
    })?;
    let pieces =
        split_checked(text, images).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let (mut prompt, mut starts) = (Vec::new(), Vec::with_capacity(images));
    for piece in pieces {
        match piece {
            Piece::Text(t) => prompt.extend(encode(t)?),
            Piece::Image(_) => {
                prompt.push(spec.open);
                starts.push(prompt.len());
                prompt.extend(std::iter::repeat_n(spec.open, spec.vision.tokens_per_image));
                prompt.push(spec.close);
            }
        }
    }
    Ok((prompt, starts))
}

/// The engine's images: each decoded image preprocessed for the model's tower (llama.cpp's
/// resize and normalisation, [`sluice_model::vision::preprocess`]) at its place in the prompt,
/// keyed by its content hash. CPU work: run off the async workers.
fn prompt_images(
    model: &ServedModel,
    images: Vec<DecodedImage>,
    starts: &[usize],
) -> Result<Vec<PromptImage>, ApiError> {
    let Some(spec) = model.image_input.as_ref() else {
        return Ok(Vec::new());
    };
    images
        .into_iter()
        .zip(starts)
        .map(|(image, &start)| {
            let pixels = sluice_model::vision::preprocess(
                &spec.vision,
                &image.rgb,
                image.width as usize,
                image.height as usize,
            )
            .map_err(|e| ApiError::internal(format!("cannot preprocess an image: {e}")))?;
            let mut hash = [0u8; 8];
            hash.copy_from_slice(&image.sha256[..8]);
            Ok(PromptImage {
                start,
                len: spec.vision.tokens_per_image,
                hash: u64::from_le_bytes(hash),
                pixels: pixels.into(),
            })
        })
        .collect()
}

/// The tokens of the prompt that [`start`] would render for this conversation (tools planned
/// and rendered alike), without generating: Anthropic's `count_tokens`.
pub async fn count_prompt_tokens(
    model: Arc<ServedModel>,
    messages: Vec<ChatMessageIn>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<ToolChoice>,
    parallel_tool_calls: Option<bool>,
    chat_template_kwargs: Option<Map<String, Value>>,
) -> Result<usize, ApiError> {
    check_images(&model, &messages)?;
    let plan = plan_tools(&model, tools, tool_choice, parallel_tool_calls)?;
    let images = conversation_images(&messages).count();
    tokenize_blocking(move || {
        let (_, prompt, _) = render_prompt(
            &model,
            &messages,
            images,
            plan.template_tools.as_deref(),
            chat_template_kwargs.as_ref(),
        )?;
        Ok(prompt.len())
    })
    .await
}

/// One choice, read whole.
pub struct ChoiceResult {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCallOut>,
    pub reasoning_tokens: usize,
    /// `None` only if the engine never finished it, which [`collect`] reports as an error.
    pub finish: Option<FinishEvent>,
}

impl ChoiceResult {
    /// The engine's finish of this choice (every choice [`collect`] returns has one).
    pub fn reason(&self) -> Option<FinishReason> {
        self.finish.as_ref().map(|f| f.reason)
    }
}

/// Reads every choice of `run` to its end; `on_token` sees each token event (for logprobs).
/// A choice the engine failed fails the whole response.
pub async fn collect(
    run: &mut ChatRun,
    mut on_token: impl FnMut(usize, &TokenEvent),
) -> Result<Vec<ChoiceResult>, ApiError> {
    let generation = &mut run.generation;
    let mut parsed: Vec<ChoiceOutput> = (0..generation.num_choices())
        .map(|_| ChoiceOutput::new(&run.output))
        .collect();
    let mut results: Vec<ChoiceResult> = (0..generation.num_choices())
        .map(|_| ChoiceResult {
            content: String::new(),
            reasoning: String::new(),
            calls: Vec::new(),
            reasoning_tokens: 0,
            finish: None,
        })
        .collect();
    while let Some(item) = generation.next().await {
        match item {
            Item::Token { choice, event } => {
                let (Some(parser), Some(result)) =
                    (parsed.get_mut(choice), results.get_mut(choice))
                else {
                    continue;
                };
                let delta = parser.push(&event.text);
                result.content.push_str(&delta.content);
                result.reasoning.push_str(&delta.reasoning);
                on_token(choice, &event);
            }
            Item::Finished { event, .. } if event.reason == FinishReason::Error => {
                return Err(generation::engine_failure(&event))
            }
            Item::Finished { choice, event } => {
                let (Some(parser), Some(result)) =
                    (parsed.get_mut(choice), results.get_mut(choice))
                else {
                    continue;
                };
                let delta = parser.finish();
                result.content.push_str(&delta.content);
                result.reasoning.push_str(&delta.reasoning);
                result.finish = Some(event);
            }
            Item::Lost => return Err(generation::engine_lost()),
        }
    }
    for (result, parser) in results.iter_mut().zip(&parsed) {
        result.calls = parser.calls();
        result.reasoning_tokens = parser.reasoning_tokens();
    }
    Ok(results)
}
