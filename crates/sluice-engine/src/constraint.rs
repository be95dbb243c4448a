//! Grammar-constrained decoding on llguidance: which tokens a sequence may sample next so that
//! its output stays in a language (a JSON schema, a regex, a list of choices, a Lark grammar;
//! written in [`crate::grammar`]).
//!
//! Three pieces, one per moment of a request's life:
//! - [`ConstraintCompiler`], one per model: llguidance's token trie over *our* tokenizer's
//!   bytes (control tokens marked special, so a grammar can never spell `<|im_end|>` by
//!   accident) and the parser factory. The server compiles each request's grammar with it at
//!   the edge, so a bad schema is a 400 before admission.
//! - [`Constraint`], the compiled grammar a [`crate::Request`] carries to the engine.
//! - [`SeqConstraint`], one per sequence on the engine thread: a matcher advanced by every
//!   committed token and the bit mask of the tokens allowed next. Preemption by recompute
//!   keeps a sequence's generated tokens, so its matcher never needs to be rolled back.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use llguidance::{Matcher, ParserFactory};
use sluice_tokenizer::Tokenizer;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::grammar::{Grammar, GrammarError};

/// llguidance's message without the parser state and grammar it may append: clients get the
/// reason, not a dump of the grammar engine.
fn short_error(message: &str) -> String {
    let cut = ["\n<state>", "\n<non-verbose/>"]
        .iter()
        .filter_map(|marker| message.find(marker))
        .min()
        .unwrap_or(message.len());
    message[..cut].trim_end().to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar, schema or regex cannot be compiled; the message says why.
    #[error("{0}")]
    Invalid(String),
    /// The vocabulary cannot be turned into a token trie.
    #[error("cannot prepare constrained decoding for this vocabulary: {0}")]
    Vocabulary(String),
}

impl From<GrammarError> for ConstraintError {
    fn from(e: GrammarError) -> Self {
        Self::Invalid(e.to_string())
    }
}

/// llguidance's view of our tokenizer: every id's bytes, and tokenization for the text a
/// grammar forces.
struct SluiceTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for SluiceTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text a grammar forces, as tokens. Our tokenizer reads `<|im_start|>` in text as the
    /// control token, which no grammar may produce; such text falls back to the trie's
    /// greedy tokenization, which never yields a control token.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |text| match self.tokenizer.encode(text) {
                Ok(ids) if !ids.iter().any(|&id| self.tokenizer.is_special(id)) => ids,
                _ => self.trie.greedy_tokenize(text.as_bytes()),
            })
    }
}

/// Compiled grammars kept for reuse: agents send the same tools and schemas with every
/// request, and compiling one can take longer than the request's first token.
const CACHED_GRAMMARS: usize = 64;

/// Compiles requests' grammars against one model's vocabulary. Building it walks the whole
/// vocabulary once (tens of milliseconds for 150k tokens), so the server makes one lazily.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    /// Every id that ends generation; llguidance knows one EOS, the mask allows them all.
    eos_ids: Arc<[u32]>,
    /// The last grammars compiled, by their text; never advanced (sequences clone them).
    cache: Mutex<HashMap<String, Constraint>>,
}

impl fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

impl ConstraintCompiler {
    /// `vocab_size` is the width of the model's logits, which may exceed the tokenizer's
    /// vocabulary (padding ids have no bytes and are never allowed).
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize) -> Result<Self, ConstraintError> {
        let eos_ids: Arc<[u32]> = tokenizer.eos_token_ids().into();
        let Some(&eos) = eos_ids.first() else {
            return Err(ConstraintError::Vocabulary(
                "the tokenizer has no end-of-sequence token".into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                if tokenizer.is_special(id) {
                    // llguidance's marker for tokens no text can produce.
                    let mut word = Vec::with_capacity(bytes.len() + 1);
                    word.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    word.extend_from_slice(bytes);
                    word
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(vocab_size as u32, eos);
        info.tok_bos = tokenizer.bos_token_id();
        info.tok_pad = tokenizer.pad_token_id();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(SluiceTokEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            eos_ids,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Compiles `grammar`, or hands back the compilation of the same grammar from an earlier
    /// request; the error says what is wrong with it.
    pub fn compile(&self, grammar: Grammar) -> Result<Constraint, ConstraintError> {
        let key = grammar.cache_key();
        if let Some(hit) = self.cache_lock().get(&key) {
            return Ok(hit.clone());
        }
        let compiled = self.compile_uncached(grammar)?;
        let mut cache = self.cache_lock();
        if cache.len() >= CACHED_GRAMMARS {
            // Any entry: a cache this small is for the few grammars a deployment repeats.
            if let Some(old) = cache.keys().next().cloned() {
                cache.remove(&old);
            }
        }
        cache.insert(key, compiled.clone());
        Ok(compiled)
    }

    fn cache_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Constraint>> {
        // The map is never left half-updated, so a panic elsewhere does not spoil it.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn compile_uncached(&self, grammar: Grammar) -> Result<Constraint, ConstraintError> {
        let kind = grammar.kind();
        let top = grammar.into_top_level()?;
        // llguidance reports bad input as errors; a panic inside it (a bug) must still only
        // fail this request.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.factory.create_parser(top)
        }))
        .map_err(|_| ConstraintError::Invalid("the grammar engine failed on this input".into()))?
        .map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Invalid(short_error(&e)));
        }
        // The first mask, on a copy: a grammar with no finite derivation (`start: start "a"`)
        // or one past the parser's budget from the start fails here, as a 400 naming the
        // field, instead of failing its request after admission.
        let mut probe = matcher.deep_clone();
        if let Err(e) = probe.compute_mask() {
            return Err(ConstraintError::Invalid(short_error(&e.to_string())));
        }
        Ok(Constraint(Arc::new(Compiled {
            matcher,
            eos_ids: self.eos_ids.clone(),
            kind,
        })))
    }
}

struct Compiled {
    /// Never advanced: each sequence starts from a deep clone.
    matcher: Matcher,
    eos_ids: Arc<[u32]>,
    kind: &'static str,
}

/// A compiled grammar, ready for the engine: cheap to clone, each sequence of the request
/// runs its own copy.
#[derive(Clone)]
pub struct Constraint(Arc<Compiled>);

impl Constraint {
    /// What kind of constraint this is (`json_schema`, `regex`, `choice`, `grammar`).
    pub fn kind(&self) -> &'static str {
        self.0.kind
    }

    pub(crate) fn start(&self) -> SeqConstraint {
        let matcher = self.0.matcher.deep_clone();
        let vocab = matcher
            .tok_env()
            .map(|env| env.tok_trie().vocab_size())
            .unwrap_or(0);
        SeqConstraint {
            matcher,
            mask: SimpleVob::alloc(vocab),
            eos_ids: self.0.eos_ids.clone(),
            failed: None,
            due: false,
        }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Constraint({})", self.0.kind)
    }
}

/// Two requests carry equal constraints when they share one compilation.
impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One sequence's grammar state on the engine thread.
pub(crate) struct SeqConstraint {
    matcher: Matcher,
    /// Bit `t` of word `t / 32` set: token `t` may be sampled next.
    mask: SimpleVob,
    eos_ids: Arc<[u32]>,
    /// Why the grammar engine gave up on this sequence (a mask over its step budget, a token
    /// it could not take); the request fails with it at the next commit.
    failed: Option<String>,
    /// Samples this step, so its mask must be computed.
    pub due: bool,
}

impl SeqConstraint {
    /// Computes the tokens allowed next. llguidance bounds the work of one mask (its lexer
    /// fuel and Earley item limits), so a hostile grammar fails here instead of stalling the
    /// step for the other rows.
    pub fn compute_mask(&mut self) {
        if self.failed.is_some() {
            return;
        }
        match self.matcher.compute_mask() {
            Ok(mask) => {
                self.mask = mask;
                if self.eos_ids.iter().any(|&e| self.mask.is_allowed(e)) {
                    for &e in self.eos_ids.iter() {
                        if (e as usize) < self.mask.len() {
                            self.mask.allow_token(e);
                        }
                    }
                }
            }
            Err(e) => {
                self.failed = Some(format!(
                    "constrained decoding failed: {}",
                    short_error(&e.to_string())
                ))
            }
        }
    }

    /// The mask's words for the sampler, or `None` once the sequence failed (its token is
    /// then discarded at commit).
    pub fn allowed(&self) -> Option<&[u32]> {
        match self.failed {
            None => Some(self.mask.as_slice()),
            Some(_) => None,
        }
    }

    /// Advances the grammar by the sampled token. `Ok(true)`: the grammar is complete and
    /// admits no further token, so the sequence ends here.
    pub fn commit(&mut self, token: u32) -> Result<bool, String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.eos_ids.contains(&token) {
            // Allowed only where the grammar may end; the stop rules end the sequence.
            return Ok(true);
        }
        match self.matcher.consume_token(token) {
            Ok(()) => Ok(self.matcher.is_stopped()),
            Err(e) => {
                let e = format!(
                    "constrained decoding failed: {}",
                    short_error(&e.to_string())
                );
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tiny_tokenizer;
    use serde_json::{json, Value};

    fn compiler() -> ConstraintCompiler {
        let tok = tiny_tokenizer();
        let vocab = tok.vocab_size();
        ConstraintCompiler::new(tok, vocab).unwrap()
    }

    /// Drives a sequence greedily through the mask, always taking the lowest allowed id
    /// that is not EOS while there is one, and returns its text.
    fn walk(c: &Constraint, max: usize) -> (String, bool) {
        let tok = tiny_tokenizer();
        let mut seq = c.start();
        let mut out = Vec::new();
        for _ in 0..max {
            seq.compute_mask();
            let allowed = seq.allowed().unwrap();
            let mut pick = None;
            for (w, &bits) in allowed.iter().enumerate() {
                for b in 0..32 {
                    let t = (w * 32 + b) as u32;
                    if bits & (1 << b) != 0 && !seq.eos_ids.contains(&t) && pick.is_none() {
                        pick = Some(t);
                    }
                }
            }
            let Some(t) = pick else {
                return (tok.decode(&out, true), true);
            };
            out.push(t);
            if seq.commit(t).unwrap() {
                return (tok.decode(&out, true), true);
            }
        }
        (tok.decode(&out, true), false)
    }

    #[test]
    fn the_same_grammar_compiles_once_and_sequences_stay_independent() {
        let c = compiler();
        let a = c.compile(Grammar::Regex("[ab]{3}".into())).unwrap();
        let b = c.compile(Grammar::Regex("[ab]{3}".into())).unwrap();
        assert_eq!(a, b, "the second request reuses the first compilation");
        assert_ne!(a, c.compile(Grammar::Regex("[ab]{4}".into())).unwrap());
        // A sequence advancing its copy leaves the cached grammar at its start.
        let mut first = a.start();
        first.compute_mask();
        assert_eq!(first.commit(u32::from(b'a')), Ok(false));
        let (text, done) = walk(&b, 10);
        assert!(done && text.len() == 3, "{text}");
    }

    #[test]
    fn choices_allow_exactly_their_strings() {
        let c = compiler()
            .compile(Grammar::Choice(vec!["yes".into(), "no".into()]))
            .unwrap();
        let (text, done) = walk(&c, 10);
        assert!(done);
        assert!(text == "yes" || text == "no", "{text}");
    }

    #[test]
    fn a_regex_is_followed_to_its_end() {
        let c = compiler()
            .compile(Grammar::Regex("[0-9]{3}-x".into()))
            .unwrap();
        let (text, done) = walk(&c, 20);
        assert!(done, "{text}");
        assert_eq!(text.len(), 5);
        assert!(text.ends_with("-x"), "{text}");
    }

    #[test]
    fn json_schema_output_validates() {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
            "required": ["a", "b"],
            "additionalProperties": false
        });
        let c = compiler()
            .compile(Grammar::Json {
                schema,
                strict: true,
            })
            .unwrap();
        let (text, done) = walk(&c, 64);
        assert!(done, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        // `-0` is a JSON-schema integer too, and the lowest-id walk writes it.
        assert!(v["a"].as_f64().is_some_and(|a| a.fract() == 0.0), "{text}");
        assert!(v["b"] == "x" || v["b"] == "y", "{text}");
    }

    #[test]
    fn bad_constraints_are_errors_not_panics() {
        let c = compiler();
        for g in [
            Grammar::Regex("(".into()),
            Grammar::Lark("start: undefined_rule".into()),
            Grammar::Lark("this is not a grammar".into()),
            // No finite derivation: refused at compile time, by the first mask.
            Grammar::Lark("start: start \"a\"".into()),
            Grammar::Lark("start: a\na: b\nb: a".into()),
            Grammar::Choice(vec![]),
            Grammar::Json {
                schema: json!(5),
                strict: true,
            },
            Grammar::Json {
                schema: json!({"type": "no-such-type"}),
                strict: true,
            },
            Grammar::Json {
                schema: json!({"$ref": "#/$defs/missing"}),
                strict: true,
            },
        ] {
            let shown = format!("{g:?}");
            match c.compile(g) {
                Err(ConstraintError::Invalid(m)) => {
                    assert!(!m.contains("<state>") && !m.contains("<non-verbose"), "{m}");
                    assert!(!m.is_empty());
                }
                other => panic!("{shown}: {other:?}"),
            }
        }
    }

    #[test]
    fn strict_refuses_what_it_cannot_enforce_and_lenient_does_not() {
        let schema = json!({"type": "string", "format": "no-such-format"});
        let c = compiler();
        assert!(c
            .compile(Grammar::Json {
                schema: schema.clone(),
                strict: true
            })
            .is_err());
        assert!(c
            .compile(Grammar::Json {
                schema,
                strict: false
            })
            .is_ok());
    }

    #[test]
    fn a_choice_spelling_a_control_token_is_written_as_text() {
        let c = compiler()
            .compile(Grammar::Choice(vec!["<|im_start|>".into()]))
            .unwrap();
        let (text, done) = walk(&c, 40);
        assert!(done);
        assert_eq!(text, "<|im_start|>");
    }

    #[test]
    fn control_tokens_are_never_allowed_by_text_grammars() {
        let tok = tiny_tokenizer();
        let c = compiler().compile(Grammar::Regex(".*".into())).unwrap();
        let mut seq = c.start();
        seq.compute_mask();
        let allowed = seq.allowed().unwrap();
        for id in 0..tok.vocab_size() as u32 {
            let bit = allowed[id as usize / 32] & (1 << (id % 32)) != 0;
            if tok.is_special(id) && !seq.eos_ids.contains(&id) {
                assert!(!bit, "control token {id} allowed");
            }
        }
    }
}

/// The grammars of a Harmony model (gpt-oss), compiled against a vocabulary with Harmony's
/// control tokens: a forced call, a structured answer on the `final` channel, and `auto` with
/// strict tools. Each accepts what the model writes, token for token, refuses what breaks the
/// format, and what it accepts reads back through the Harmony parser as the call or answer.
#[cfg(test)]
mod harmony_tests {
    use super::*;
    use crate::grammar::FunctionSpec;
    use serde_json::{json, Value};
    use sluice_tokenizer::testing::tiny_harmony_metadata;
    use sluice_tokenizer::{ToolCallFormat, ToolEvent};
    use std::path::Path;

    fn tokenizer() -> Arc<Tokenizer> {
        Arc::new(Tokenizer::from_gguf(&tiny_harmony_metadata(), Path::new("harmony.gguf")).unwrap())
    }

    fn compiler(tok: &Arc<Tokenizer>) -> ConstraintCompiler {
        ConstraintCompiler::new(tok.clone(), tok.vocab_size()).unwrap()
    }

    fn tools() -> Vec<FunctionSpec> {
        vec![
            FunctionSpec {
                name: "get_weather".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": false,
                }),
            },
            FunctionSpec {
                name: "now".into(),
                parameters: Value::Null,
            },
        ]
    }

    /// Whether the grammar takes `text`'s tokens one by one and may end after them (it is
    /// complete, or an EOS id is allowed next).
    fn accepts(c: &ConstraintCompiler, tok: &Tokenizer, grammar: Grammar, text: &str) -> bool {
        let mut seq = c.compile(grammar).unwrap().start();
        let ids = tok.encode(text).unwrap();
        let allowed = |seq: &SeqConstraint, id: u32| {
            let words = seq.allowed().unwrap();
            words[id as usize / 32] & (1 << (id % 32)) != 0
        };
        for (i, &id) in ids.iter().enumerate() {
            seq.compute_mask();
            if !allowed(&seq, id) {
                return false;
            }
            if seq.commit(id).unwrap() {
                // Complete: nothing may follow.
                return i + 1 == ids.len();
            }
        }
        seq.compute_mask();
        let eos = tok.token_to_id("<|call|>").unwrap();
        allowed(&seq, eos)
    }

    fn read(text: &str) -> Vec<ToolEvent> {
        let mut parser = ToolCallFormat::Harmony.parser();
        let mut out = Vec::new();
        parser.push(text, &mut out);
        parser.finish(&mut out);
        out
    }

    #[test]
    fn a_forced_call_is_one_valid_call_on_the_commentary_channel() {
        let tok = tokenizer();
        let c = compiler(&tok);
        let forced = || Grammar::forced_tool_call(ToolCallFormat::Harmony, &tools(), true, false);
        let good = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                    {\"city\": \"Paris\"}";
        assert!(accepts(&c, &tok, forced(), good));
        assert_eq!(
            read(good),
            vec![
                ToolEvent::CallStart {
                    index: 0,
                    name: "get_weather".into()
                },
                ToolEvent::CallArguments {
                    index: 0,
                    fragment: "{\"city\": \"Paris\"}".into()
                },
            ]
        );
        assert!(accepts(
            &c,
            &tok,
            forced(),
            "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}"
        ));
        // Against the schema, an unknown tool, an answer instead of a call, no header.
        for bad in [
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"town\": \"x\"}",
            "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}",
            "<|channel|>final<|message|>Hi",
            "{\"city\": \"Paris\"}",
        ] {
            assert!(!accepts(&c, &tok, forced(), bad), "{bad}");
        }
        // Without tools, any name.
        let any = Grammar::forced_tool_call(ToolCallFormat::Harmony, &[], false, false);
        assert!(accepts(
            &c,
            &tok,
            any,
            "<|channel|>commentary to=functions.x_1 <|constrain|>json<|message|>{\"a\": 1}"
        ));
    }

    #[test]
    fn a_structured_answer_follows_the_final_channel() {
        let tok = tokenizer();
        let c = compiler(&tok);
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
            "required": ["n"], "additionalProperties": false});
        let answer = || {
            Grammar::Json {
                schema: schema.clone(),
                strict: true,
            }
            .harmony_answer()
        };
        let good = "<|channel|>final<|message|>{\"n\": 3}";
        assert!(accepts(&c, &tok, answer(), good));
        assert_eq!(read(good), vec![ToolEvent::Content("{\"n\": 3}".into())]);
        assert!(!accepts(&c, &tok, answer(), "{\"n\": 3}"));
        assert!(!accepts(
            &c,
            &tok,
            answer(),
            "<|channel|>final<|message|>{\"n\": \"3\"}"
        ));
        let choice = Grammar::Choice(vec!["yes".into(), "no".into()]).harmony_answer();
        assert!(accepts(&c, &tok, choice, "<|channel|>final<|message|>no"));
    }

    #[test]
    fn auto_with_strict_tools_allows_reasoning_then_an_answer_or_a_valid_call() {
        let tok = tokenizer();
        let c = compiler(&tok);
        let auto =
            || Grammar::auto_tool_call(ToolCallFormat::Harmony, &tools(), true, true).unwrap();
        let reasoning = "<|channel|>analysis<|message|>The user wants the weather.<|end|>\
                         <|start|>assistant";
        let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                    {\"city\": \"Oslo\"}";
        for good in [
            format!("{reasoning}{call}"),
            call.to_string(),
            format!("{reasoning}<|channel|>final<|message|>It is sunny."),
            "<|channel|>final<|message|>Hello".to_string(),
        ] {
            assert!(accepts(&c, &tok, auto(), &good), "{good}");
        }
        assert!(!accepts(
            &c,
            &tok,
            auto(),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}"
        ));
        let events = read(&format!("{reasoning}{call}"));
        assert_eq!(
            events[0],
            ToolEvent::Reasoning("The user wants the weather.".into())
        );
        assert!(matches!(&events[1], ToolEvent::CallStart { name, .. } if name == "get_weather"));
    }
}
