//! The GBNF conversion's tests: grammars converted and run through llguidance's matcher
//! (what each accepts and rejects), the nesting limits, the errors and where they point, and
//! random input that never panics and GBNF-like text that always converts to valid Lark.

use std::sync::OnceLock;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use proptest::prelude::*;
use toktrie::{ApproximateTokEnv, TokenId};

use super::*;

/// One factory over a byte-level vocabulary (token i is byte i, plus a few specials ending
/// in EOS), so that a string is fed to the matcher one byte per token.
fn factory() -> &'static ParserFactory {
    static FACTORY: OnceLock<ParserFactory> = OnceLock::new();
    FACTORY.get_or_init(|| {
        let env = ApproximateTokEnv::single_byte_env();
        let mut f = ParserFactory::new_simple(&env).expect("parser factory");
        f.quiet();
        f
    })
}

/// A matcher for `lark`, failing the test when llguidance does not compile it.
fn matcher(lark: &str) -> Matcher {
    let parser = factory().create_parser(TopLevelGrammar::from_lark(lark.to_string()));
    let m = Matcher::new(parser);
    assert!(
        !m.is_error(),
        "llguidance rejected:\n{lark}\n{:?}",
        m.get_error()
    );
    m
}

/// Whether the grammar accepts exactly `s` (every byte allowed, and may stop there).
fn accepts(lark: &str, s: &str) -> bool {
    let mut m = matcher(lark);
    let tokens: Vec<TokenId> = s.bytes().map(TokenId::from).collect();
    if m.validate_tokens(&tokens).expect("validate") < tokens.len() {
        return false;
    }
    m.consume_tokens(&tokens).expect("consume");
    m.is_accepting().expect("is_accepting")
}

/// Converts `gbnf`, then checks each of `good` is accepted and each of `bad` rejected.
fn check(gbnf: &str, good: &[&str], bad: &[&str]) -> String {
    assert!(is_gbnf(gbnf));
    let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}"));
    for s in good {
        assert!(accepts(&lark, s), "should accept {s:?}\n{lark}");
    }
    for s in bad {
        assert!(!accepts(&lark, s), "should reject {s:?}\n{lark}");
    }
    lark
}

const JSON: &str = r#"
# A JSON document whose top level is an object.
root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws

object ::= "{" ws ( member ( "," ws member )* )? "}" ws
member ::= string ":" ws value
array ::=
    "[" ws
    ( value ("," ws value)* )?
    "]" ws

string ::= "\"" char* "\"" ws
char ::= [^"\\\x7F\x00-\x1F]
       | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )   # escapes

number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,4})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#;

#[test]
fn json_like_grammar() {
    check(
        JSON,
        &[
            "{}",
            r#"{"a": 1}"#,
            r#"{"a": [1, -2.5e3, "x\n\u00e9", true, null], "b": {}}"#,
            "{\"k\":\n  \"v\"}",
            r#"{"é": "ü"}"#,
        ],
        &[
            "",
            "[]",
            r#"{"a" 1}"#,
            r#"{"a": 01}"#,
            r#"{"a": "\q"}"#,
            "{\"a\": \"\u{1}\"}",
            r#"{"a": 1,}"#,
        ],
    );
}

#[test]
fn arithmetic_grammar() {
    check(
        r#"
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+
"#,
        &["1", "1+2*3", "(1+2)*3", "((42))/7-0"],
        &["", "1+", "(1", "1)", "+1", "1 + 2", "a"],
    );
}

#[test]
fn list_grammar() {
    check(
        "root ::= item+\nitem ::= \"- \" [^\\n]+ \"\\n\"\n",
        &["- a\n", "- buy milk\n- eggs, 12\n"],
        &["", "- a", "-a\n", "- \n", "- a\n\n"],
    );
}

#[test]
fn yes_no_choice() {
    let lark = check(
        r#"root ::= "yes" | "no""#,
        &["yes", "no"],
        &["", "y", "yesno", "No"],
    );
    assert_eq!(lark, "start: \"yes\" | \"no\"\n");
}

#[test]
fn escapes_in_strings_and_classes() {
    check(
        r#"root ::= "\x41\u00e9\U0001F600\t\"\\" [\]\-\\/^a]+ "/""#,
        &["Aé😀\t\"\\]/", "Aé😀\t\"\\a-^\\]/"],
        &["Aé😀\t\"\\/", "Aé😀\t\"\\b/"],
    );
    // Raw control characters and a literal newline inside a string.
    check("root ::= \"a\nb\u{1}\"", &["a\nb\u{1}"], &["ab"]);
}

#[test]
fn any_char_negated_class_and_ranges() {
    check(
        r#"root ::= "a" . "b" [^0-9] [x-z_]"#,
        &["a\nbcx", "aéb\n_", "a😀b-y"],
        &["ab", "a\nb1x", "a\nbcw"],
    );
    // `[^]` is any character, like `.`.
    check("root ::= [^]", &["\n", "é"], &["", "ab"]);
}

#[test]
fn repetitions() {
    check(
        r#"root ::= "a"{2,3} "b"{2} "c"{1,} "d"{0} "e"{0,1} ("f" "g"){,2}"#,
        &["aabbc", "aaabbcccefgfg", "aabbcfg"],
        &["abbc", "aaaabbc", "aabbcd", "aabbcfgfgfg", "aabbcee"],
    );
    // Stacked operators, as llama.cpp allows.
    check(r#"root ::= ("a"+)? "b""#, &["b", "aab"], &["a"]);
    check(r#"root ::= "a"+? "b""#, &["b", "aab"], &["a"]);
}

#[test]
fn rule_names_are_mapped_without_collisions() {
    let lark = check(
        "root ::= my-rule Foo foo start 1st\nmy-rule ::= \"a\"\nFoo ::= \"b\"\nfoo ::= \"c\"\nstart ::= \"d\"\n1st ::= \"e\"\n",
        &["abcde"],
        &["abcd", "acbde"],
    );
    assert!(
        lark.starts_with("start: my_rule foo foo_2 start_2 r_1st\n"),
        "{lark}"
    );
}

#[test]
fn multi_line_rules_and_comments() {
    check(
        "# leading comment\nroot ::= \"a\" # trailing comment\n  \"b\"\n  | \"c\"\n\n# between\nunused ::= \"z\"",
        &["ab", "c"],
        &["a", "abc", "z"],
    );
}

#[test]
fn empty_alternatives_and_literals() {
    check(
        r#"root ::= "" "a" ( | "b") ("")*"#,
        &["a", "ab"],
        &["", "b"],
    );
}

#[test]
fn deep_nesting_within_the_limit_compiles() {
    let depth = MAX_NESTING - 1;
    let gbnf = format!(
        "root ::= {}\"x\"{}",
        "(\"a\" ".repeat(depth),
        " | \"b\")".repeat(depth)
    );
    let lark = gbnf_to_lark(&gbnf).expect("within the limit");
    assert!(
        lark.contains("gbnf_aux"),
        "deep groups are hoisted:\n{lark}"
    );
    let _ = matcher(&lark);
    assert!(accepts(&lark, &format!("{}x", "a".repeat(depth))));
    assert!(accepts(&lark, "aab"));
    assert!(!accepts(&lark, "ax"));
}

/// Known difference, pinned so that it is noticed if llguidance changes: llguidance lexes
/// each literal greedily, so after `ab` it will not go back to split `a` + `bc`, while
/// llama.cpp, matching code point by code point, accepts `abc` here.
#[test]
fn greedy_lexing_differs_from_llama_cpp_on_overlapping_literals() {
    let lark = gbnf_to_lark(r#"root ::= ("ab" | "a") "bc""#).expect("converts");
    assert!(accepts(&lark, "abbc"));
    assert!(!accepts(&lark, "abc"));
    // Single-character classes repeated at rule level are not affected.
    check(r#"root ::= [a-z]* "z""#, &["z", "aaz", "zzz"], &["a"]);
}

#[test]
fn stacked_operators_count_towards_the_nesting_limit() {
    // Operators outside deep groups add to the groups' depth: 40 groups + 24 operators.
    let ok = format!(
        "root ::= {}\"a\"{}{}",
        "(".repeat(40),
        ")".repeat(16),
        ")*".repeat(24)
    );
    let lark = gbnf_to_lark(&ok).expect("64 levels");
    assert!(accepts(&lark, "aaa"));
    let bad = format!("root ::= {}\"a\"{}", "(".repeat(40), ")**".repeat(40));
    assert!(matches!(gbnf_to_lark(&bad), Err(GbnfError::TooDeep { .. })));
}

#[test]
fn is_gbnf_tells_the_dialects_apart() {
    assert!(is_gbnf("root ::= \"a\""));
    assert!(is_gbnf("# c\n  my-rule::=\"a\"\nroot ::= my-rule"));
    assert!(!is_gbnf("start: \"a\" | b\nb: /[0-9]+/"));
    assert!(!is_gbnf("start: x::param"));
    assert!(!is_gbnf(""));
}

fn syntax_at(text: &str) -> (usize, usize, String) {
    match gbnf_to_lark(text) {
        Err(GbnfError::Syntax {
            line,
            column,
            message,
        }) => (line, column, message),
        other => panic!("expected a syntax error for {text:?}, got {other:?}"),
    }
}

#[test]
fn errors_say_what_and_where() {
    assert_eq!(
        gbnf_to_lark("root ::= a\na ::= b"),
        Err(GbnfError::UndefinedRule {
            rule: "b".into(),
            line: 2,
            column: 7
        })
    );
    assert_eq!(gbnf_to_lark("main ::= \"a\""), Err(GbnfError::MissingRoot));
    assert_eq!(gbnf_to_lark(""), Err(GbnfError::MissingRoot));
    assert_eq!(
        gbnf_to_lark("root ::= \"a\"\nroot ::= \"b\""),
        Err(GbnfError::DuplicateRule {
            rule: "root".into(),
            line: 2,
            column: 1
        })
    );

    let (line, column, msg) = syntax_at("root ::= \"abc");
    assert_eq!((line, column), (1, 10));
    assert!(msg.contains("unterminated string"), "{msg}");

    let (line, column, msg) = syntax_at("root ::= (\"a\" | \"b\"\nx ::= \"c\"");
    assert_eq!((line, column), (1, 10));
    assert!(msg.contains("unbalanced `(`"), "{msg}");

    let (_, _, msg) = syntax_at("root ::= \"a\")");
    assert!(msg.contains("unbalanced `)`"), "{msg}");

    let (line, column, msg) = syntax_at("root ::= [z-a]");
    assert_eq!((line, column), (1, 12));
    assert!(msg.contains("bad character class range"), "{msg}");

    let (_, _, msg) = syntax_at("root ::= [abc");
    assert!(msg.contains("unterminated character class"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= []");
    assert!(msg.contains("empty character class"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= \"\\q\"");
    assert!(msg.contains("unknown escape"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= \"\\uD800\"");
    assert!(msg.contains("not a valid Unicode"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= \"\\x4\"");
    assert!(msg.contains("hex digits"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= * \"a\"");
    assert!(msg.contains("nothing before it"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= \"a\"{3,2}");
    assert!(msg.contains("maximum below its minimum"), "{msg}");
    let (_, _, msg) = syntax_at("root ::= \"a\"{2");
    assert!(msg.contains("expected `}`"), "{msg}");
    let (_, _, msg) = syntax_at("root \"a\"");
    assert!(msg.contains("expected `::=`"), "{msg}");

    assert!(matches!(
        gbnf_to_lark("root ::= \"a\"{10001}"),
        Err(GbnfError::RepeatTooLarge {
            limit: MAX_REPEAT,
            ..
        })
    ));
    assert!(matches!(
        gbnf_to_lark("root ::= \"a\"{1,99999999999999999999}"),
        Err(GbnfError::RepeatTooLarge { .. })
    ));
    let deep = format!(
        "root ::= {}\"a\"{}",
        "(".repeat(MAX_NESTING + 1),
        ")".repeat(65)
    );
    assert!(matches!(
        gbnf_to_lark(&deep),
        Err(GbnfError::TooDeep { .. })
    ));
    let ops = format!("root ::= \"a\"{}", "*".repeat(100_000));
    assert!(matches!(gbnf_to_lark(&ops), Err(GbnfError::TooDeep { .. })));
    let huge = format!("root ::= {}", "(".repeat(1_000_000));
    assert!(matches!(
        gbnf_to_lark(&huge),
        Err(GbnfError::TooDeep { .. })
    ));

    // Messages carry the position for the client.
    let e = gbnf_to_lark("root ::= \"abc").unwrap_err().to_string();
    assert!(e.contains("line 1, column 10"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = is_gbnf(&text);
        let _ = gbnf_to_lark(&text);
    }

    /// Text built from GBNF's own punctuation reaches far deeper into the parser than
    /// random bytes; whatever converts must also compile in llguidance.
    #[test]
    fn gbnf_like_text_converts_to_valid_lark(
        body in proptest::collection::vec(
            prop_oneof![
                Just("\"a\"".to_string()), Just("\"\\\"\\n\"".to_string()), Just("\"\"".to_string()),
                Just("[a-c]".to_string()), Just("[^\\]/]".to_string()), Just(".".to_string()),
                Just("(".to_string()), Just(")".to_string()), Just("|".to_string()),
                Just("*".to_string()), Just("+".to_string()), Just("?".to_string()),
                Just("{2}".to_string()), Just("{0,3}".to_string()), Just("{1,}".to_string()),
                Just("x".to_string()), Just("root".to_string()), Just("\n".to_string()),
                Just("x ::=".to_string()), Just("\\".to_string()), Just("[".to_string()),
                Just("\"".to_string()), Just("#".to_string()), Just("{".to_string()),
            ],
            0..24,
        )
    ) {
        let text = format!("root ::= {}", body.join(" "));
        if let Ok(lark) = gbnf_to_lark(&text) {
            let parser = factory().create_parser(TopLevelGrammar::from_lark(lark.clone()));
            prop_assert!(parser.is_ok(), "{text}\n=>\n{lark}\n{:?}", parser.err());
        }
    }
}
