//! Filter expressions over health results: Consul's `bexpr` language as service-resolver
//! subsets use it (`Subsets.<name>.Filter`), evaluated against one [`CheckServiceNode`].
//!
//! ```text
//! Service.Meta.version == v2 and Node.Meta.zone != "us-east-1a"
//! "canary" in Service.Tags
//! not (Service.ID matches "^web-[0-9]+$")
//! ```
//!
//! # Grammar
//!
//! Matching expressions (`not` may also be written before `in`, `contains` and `matches`):
//!
//! | form | meaning |
//! |---|---|
//! | `Selector == Value`, `Selector != Value` | equality |
//! | `Value in Selector`, `Value not in Selector` | membership: a tag of a list, a key of a map, a substring of a string |
//! | `Selector contains Value`, `Selector not contains Value` | the same as `in`, operands reversed |
//! | `Selector matches "regex"`, `Selector not matches "regex"` | regular expression search (unanchored, RE2 syntax) |
//! | `Selector is empty`, `Selector is not empty` | empty string, list or map |
//!
//! They combine with `and`, `or`, `not` and parentheses; `not` binds tighter than `and`,
//! which binds tighter than `or`. Keywords are lower case; selectors are case-sensitive.
//!
//! Values are double-quoted strings with Go's backslash escapes (`"a\"b"`, `"\u00e9"`),
//! backtick raw strings (`` `^web-\d+$` ``), or bare words of ASCII letters, digits and
//! `_ - . / :` (`v2`, `8080`, `us-east-1a`). `and` and `or` are always connectives: quote
//! them to use them as values (`"and"`).
//!
//! # Selectors
//!
//! Each kind of record has its own (Consul's, per endpoint; see [`records`]). A health
//! result ([`CheckServiceNode`], the default) has:
//!
//! | selector | type |
//! |---|---|
//! | `Service.ID`, `Service.Service`, `Service.Address`, `Service.Kind`, `Service.SocketPath` | string |
//! | `Service.Tags` | list of strings |
//! | `Service.Meta`, `Service.TaggedAddresses` | map (key membership, emptiness) |
//! | `Service.Meta.<key>`, `Service.Meta["<key>"]` | string; a missing key reads as `""` |
//! | `Service.Port`, `Service.Weights.Passing`, `Service.Weights.Warning` | integer |
//! | `Service.EnableTagOverride`, `Service.Connect.Native` | boolean |
//! | `Service.Proxy.DestinationServiceName`, `Service.Proxy.DestinationServiceID` | string |
//! | `Node.ID`, `Node.Node`, `Node.Address`, `Node.Datacenter` | string |
//! | `Node.Meta`, `Node.TaggedAddresses` | map |
//! | `Node.Meta.<key>`, `Node.TaggedAddresses.<key>` (or `["<key>"]`) | string; a missing key reads as `""` |
//!
//! Strings take every operator. Lists and maps take `in`, `contains` and `is empty` (and
//! their negations). Integers and booleans take `==` and `!=`, with a value that must parse
//! as one (Go's spellings of booleans: `true`, `T`, `1`, `false`, `F`, `0`, ...).
//!
//! Everything that can be wrong is found by [`Filter::parse`]: unknown selectors, operators
//! a selector does not take, values of the wrong type, invalid regular expressions. Consul
//! refuses such a subset filter when the config entry is written; so does meshd.
//!
//! Unlike Consul, a dotted map key may contain `-`, `.`, `/` and `:`
//! (`Service.Meta.app-version`); Consul needs the bracket form for those.

use crate::CheckServiceNode;
use regex::{Regex, RegexBuilder};
use std::{fmt, str::FromStr};

pub mod records;
pub use records::{CatalogRow, JwtIdentity, Record, Selector, ServiceAccountIdentity};
use records::{Field, Got};

/// Deepest nesting of parentheses accepted (the parser recurses once per level).
const MAX_DEPTH: usize = 32;
/// Upper bound on the compiled size of one `matches` regular expression.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A parsed filter expression, ready to be evaluated against records of type `T` (health
/// results unless said otherwise).
///
/// The empty expression matches every record.
#[derive(Debug, Clone)]
pub struct Filter<T: Record = CheckServiceNode> {
    source: String,
    expr: Option<Expr<T>>,
}

impl<T: Record> Default for Filter<T> {
    fn default() -> Self {
        Filter {
            source: String::new(),
            expr: None,
        }
    }
}

/// Why a filter expression does not parse. Every message names the offending token or
/// selector and its byte offset in the expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// A character that cannot start any token.
    #[error("unexpected character {ch:?} at offset {offset}{}", char_hint(*.ch))]
    UnexpectedChar {
        /// Byte offset of the character.
        offset: usize,
        /// The character.
        ch: char,
    },
    /// A quoted string without its closing quote.
    #[error("unterminated string starting at offset {offset}")]
    UnterminatedString {
        /// Byte offset of the opening quote.
        offset: usize,
    },
    /// A backslash escape a double-quoted string cannot contain.
    #[error("invalid escape sequence \"{escape}\" at offset {offset}")]
    InvalidEscape {
        /// Byte offset of the backslash.
        offset: usize,
        /// The escape as written.
        escape: String,
    },
    /// Something other than what the grammar allows at this point.
    #[error("expected {expected} at offset {offset}, found {found}")]
    Syntax {
        /// Byte offset of the token found (the length of the expression at its end).
        offset: usize,
        /// What would have been valid, with its context (`a value after "=="`).
        expected: String,
        /// The token found, or `end of input`.
        found: String,
    },
    /// A `(` without its `)`.
    #[error("unclosed \"(\" at offset {open}: expected \")\" at offset {offset}, found {found}")]
    Unclosed {
        /// Byte offset of the `(`.
        open: usize,
        /// Byte offset where `)` was expected.
        offset: usize,
        /// The token found instead, or `end of input`.
        found: String,
    },
    /// Parentheses nested deeper than meshd evaluates.
    #[error("parentheses nested deeper than {max} levels at offset {offset}")]
    TooDeep {
        /// Byte offset of the `(` one level too deep.
        offset: usize,
        /// The deepest nesting accepted.
        max: usize,
    },
    /// A selector that names no field of the records filtered.
    #[error("unknown selector \"{selector}\" at offset {offset}: known selectors are {known}")]
    UnknownSelector {
        /// Byte offset of the selector.
        offset: usize,
        /// The selector as written.
        selector: String,
        /// The selectors the records have.
        known: String,
    },
    /// An operator the selector's type does not take (`==` on a list).
    #[error("operator \"{operator}\" at offset {offset} does not apply to \"{selector}\" ({kind}): use {supported}")]
    UnsupportedOperator {
        /// Byte offset of the operator.
        offset: usize,
        /// The operator (`==`, `not contains`, `is empty`, ...).
        operator: &'static str,
        /// The selector as written.
        selector: String,
        /// The selector's type (`a list`, `an integer`, ...).
        kind: &'static str,
        /// The operators it does take.
        supported: &'static str,
    },
    /// A value that does not parse as the selector's type (`Service.Port == web`).
    #[error("invalid value {value:?} for \"{selector}\" at offset {offset}: expected {expected}")]
    InvalidValue {
        /// Byte offset of the value.
        offset: usize,
        /// The value (unquoted).
        value: String,
        /// The selector as written.
        selector: String,
        /// What the selector takes.
        expected: String,
    },
    /// A `matches` pattern that does not compile.
    #[error("invalid regular expression {pattern:?} at offset {offset}: {reason}")]
    InvalidRegex {
        /// Byte offset of the pattern.
        offset: usize,
        /// The pattern (unquoted).
        pattern: String,
        /// Why it does not compile.
        reason: String,
    },
}

impl FilterError {
    /// Byte offset in the expression the error points at.
    pub fn offset(&self) -> usize {
        match self {
            FilterError::UnexpectedChar { offset, .. }
            | FilterError::UnterminatedString { offset }
            | FilterError::InvalidEscape { offset, .. }
            | FilterError::Syntax { offset, .. }
            | FilterError::Unclosed { offset, .. }
            | FilterError::TooDeep { offset, .. }
            | FilterError::UnknownSelector { offset, .. }
            | FilterError::UnsupportedOperator { offset, .. }
            | FilterError::InvalidValue { offset, .. }
            | FilterError::InvalidRegex { offset, .. } => *offset,
        }
    }
}

fn char_hint(ch: char) -> &'static str {
    match ch {
        '=' => " (equality is \"==\")",
        '!' => " (inequality is \"!=\"; negation is \"not\")",
        '\'' => " (quote strings with \" or `)",
        '&' => " (conjunction is \"and\")",
        '|' => " (disjunction is \"or\")",
        _ => "",
    }
}

impl<T: Record> Filter<T> {
    /// Parses `expr`. The empty (or all-whitespace) expression matches everything.
    pub fn parse(expr: &str) -> Result<Filter<T>, FilterError> {
        let tokens = lex(expr)?;
        if tokens.is_empty() {
            return Ok(Filter {
                source: expr.to_owned(),
                expr: None,
            });
        }
        let mut parser = Parser {
            src: expr,
            tokens,
            pos: 0,
            depth: 0,
        };
        let parsed = parser.parse_or()?;
        if parser.peek().is_some() {
            return Err(parser.expected("\"and\", \"or\" or the end of the expression".to_owned()));
        }
        Ok(Filter {
            source: expr.to_owned(),
            expr: Some(parsed),
        })
    }

    /// True when `record` satisfies the expression.
    pub fn matches(&self, record: &T) -> bool {
        self.expr.as_ref().is_none_or(|e| e.eval(record))
    }

    /// True for the empty expression, which matches every record.
    pub fn matches_everything(&self) -> bool {
        self.expr.is_none()
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl<T: Record> FromStr for Filter<T> {
    type Err = FilterError;
    fn from_str(s: &str) -> Result<Self, FilterError> {
        Filter::parse(s)
    }
}

impl<T: Record> fmt::Display for Filter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation

#[derive(Debug, Clone)]
enum Expr<T: Record> {
    Any(Vec<Expr<T>>),
    All(Vec<Expr<T>>),
    Not(Box<Expr<T>>),
    Match(Match<T>),
}

impl<T: Record> Expr<T> {
    fn eval(&self, record: &T) -> bool {
        match self {
            Expr::Any(terms) => terms.iter().any(|t| t.eval(record)),
            Expr::All(terms) => terms.iter().all(|t| t.eval(record)),
            Expr::Not(e) => !e.eval(record),
            Expr::Match(m) => m.eval(record),
        }
    }
}

#[derive(Debug, Clone)]
struct Match<T: Record> {
    field: Field<T>,
    test: Test,
    negate: bool,
}

#[derive(Debug, Clone)]
enum Test {
    Equals(Value),
    Contains(String),
    Matches(Regex),
    IsEmpty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Text(String),
    Integer(u64),
    Boolean(bool),
}

impl<T: Record> Match<T> {
    fn eval(&self, record: &T) -> bool {
        let got = self.field.get(record);
        let hit = match (&self.test, got) {
            (Test::Equals(Value::Text(want)), Got::Text(s)) => s == want,
            (Test::Equals(Value::Integer(want)), Got::Integer(n)) => n == *want,
            (Test::Equals(Value::Boolean(want)), Got::Boolean(b)) => b == *want,
            (Test::Contains(want), Got::Text(s)) => s.contains(want.as_str()),
            (Test::Contains(want), Got::List(items)) => items.iter().any(|i| i == want),
            (Test::Contains(want), Got::Keys(keys)) => keys.contains(want),
            (Test::Matches(re), Got::Text(s)) => re.is_match(s),
            (Test::IsEmpty, Got::Text(s)) => s.is_empty(),
            (Test::IsEmpty, Got::List(items)) => items.is_empty(),
            (Test::IsEmpty, Got::Keys(keys)) => keys.is_empty(),
            // Each element's value: any that passes (a negated test: none).
            (Test::Equals(Value::Text(want)), Got::Each(values)) => values.iter().any(|s| s == want),
            (Test::Contains(want), Got::Each(values)) => values.iter().any(|s| s.contains(want.as_str())),
            (Test::Matches(re), Got::Each(values)) => values.iter().any(|s| re.is_match(s)),
            (Test::IsEmpty, Got::Each(values) | Got::Members(values)) => values.is_empty(),
            (Test::Contains(want), Got::Members(ids)) => ids.iter().any(|i| i == want),
            // Parsing pairs every test with a field it applies to; a mismatch never matches,
            // negated or not.
            _ => return false,
        };
        hit != self.negate
    }
}

// ---------------------------------------------------------------------------------------------
// Lexing

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    LParen,
    RParen,
    LBracket,
    RBracket,
    Equal,
    NotEqual,
    /// A bare word: keyword, selector or unquoted value.
    Word(String),
    /// A quoted string, unescaped.
    Str(String),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    start: usize,
    end: usize,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/' | b':')
}

fn lex(src: &str) -> Result<Vec<Token>, FilterError> {
    let bytes = src.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let start = i;
        let tok = match b {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'(' | b')' | b'[' | b']' => {
                i += 1;
                match b {
                    b'(' => Tok::LParen,
                    b')' => Tok::RParen,
                    b'[' => Tok::LBracket,
                    _ => Tok::RBracket,
                }
            }
            b'=' | b'!' if bytes.get(i + 1) == Some(&b'=') => {
                i += 2;
                if b == b'=' { Tok::Equal } else { Tok::NotEqual }
            }
            b'"' => {
                let (s, end) = lex_quoted(src, i)?;
                i = end;
                Tok::Str(s)
            }
            b'`' => {
                let body = &src[i + 1..];
                let Some(len) = body.find('`') else {
                    return Err(FilterError::UnterminatedString { offset: i });
                };
                i += len + 2;
                Tok::Str(body[..len].to_owned())
            }
            _ if is_word_byte(b) => {
                while bytes.get(i).copied().is_some_and(is_word_byte) {
                    i += 1;
                }
                Tok::Word(src[start..i].to_owned())
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or(char::REPLACEMENT_CHARACTER);
                return Err(FilterError::UnexpectedChar { offset: i, ch });
            }
        };
        tokens.push(Token { tok, start, end: i });
    }
    Ok(tokens)
}

/// Lexes the double-quoted string opening at `open`: its unescaped text and the offset after
/// its closing quote.
fn lex_quoted(src: &str, open: usize) -> Result<(String, usize), FilterError> {
    let mut out = String::new();
    let mut chars = src[open + 1..]
        .char_indices()
        .map(|(k, c)| (open + 1 + k, c))
        .peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Ok((out, at + 1)),
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                let simple = match e {
                    'a' => Some('\x07'),
                    'b' => Some('\x08'),
                    'f' => Some('\x0c'),
                    'n' => Some('\n'),
                    'r' => Some('\r'),
                    't' => Some('\t'),
                    'v' => Some('\x0b'),
                    '\\' => Some('\\'),
                    '"' => Some('"'),
                    _ => None,
                };
                if let Some(s) = simple {
                    out.push(s);
                    continue;
                }
                let digits = match e {
                    'x' => 2,
                    'u' => 4,
                    'U' => 8,
                    _ => 0,
                };
                let mut end = at + 1 + e.len_utf8();
                let mut code = 0u32;
                let mut ok = digits > 0;
                for _ in 0..digits {
                    match chars.peek().and_then(|&(_, d)| d.to_digit(16)) {
                        Some(d) => {
                            code = code * 16 + d;
                            chars.next();
                            end += 1;
                        }
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                // `\x` escapes one byte in Go; only ASCII ones make valid UTF-8 on their own.
                let decoded = char::from_u32(code).filter(|_| ok && (e != 'x' || code < 0x80));
                match decoded {
                    Some(ch) => out.push(ch),
                    None => {
                        return Err(FilterError::InvalidEscape {
                            offset: at,
                            escape: src[at..end].to_owned(),
                        });
                    }
                }
            }
            c => out.push(c),
        }
    }
    Err(FilterError::UnterminatedString { offset: open })
}

// ---------------------------------------------------------------------------------------------
// Parsing

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal,
    NotEqual,
    In,
    NotIn,
    Contains,
    NotContains,
    Matches,
    NotMatches,
    IsEmpty,
    IsNotEmpty,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Equal => "==",
            Op::NotEqual => "!=",
            Op::In => "in",
            Op::NotIn => "not in",
            Op::Contains => "contains",
            Op::NotContains => "not contains",
            Op::Matches => "matches",
            Op::NotMatches => "not matches",
            Op::IsEmpty => "is empty",
            Op::IsNotEmpty => "is not empty",
        }
    }

    fn negated(self) -> bool {
        matches!(
            self,
            Op::NotEqual | Op::NotIn | Op::NotContains | Op::NotMatches | Op::IsNotEmpty
        )
    }
}

struct Parser<'a> {
    src: &'a str,
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn peek_tok(&self) -> Option<&Tok> {
        self.peek().map(|t| &t.tok)
    }

    fn bump(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        let hit = self.peek_tok() == Some(tok);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let hit = matches!(self.peek_tok(), Some(Tok::Word(w)) if w == word);
        if hit {
            self.pos += 1;
        }
        hit
    }

    /// Offset of the next token, or the end of the expression.
    fn offset(&self) -> usize {
        self.peek().map_or(self.src.len(), |t| t.start)
    }

    fn describe(&self, t: &Token) -> String {
        let text = &self.src[t.start..t.end];
        match t.tok {
            Tok::Str(_) => format!("string {text}"),
            _ => format!("\"{text}\""),
        }
    }

    /// The next token as an error shows it.
    fn found(&self) -> String {
        self.peek()
            .map_or_else(|| "end of input".to_owned(), |t| self.describe(t))
    }

    /// ` after "<previous token>"`, or nothing at the start.
    fn after_previous(&self) -> String {
        match self.pos.checked_sub(1).and_then(|p| self.tokens.get(p)) {
            Some(t) => format!(" after {}", self.describe(t)),
            None => String::new(),
        }
    }

    /// A syntax error at the next token.
    fn expected(&self, expected: String) -> FilterError {
        FilterError::Syntax {
            offset: self.offset(),
            expected,
            found: self.found(),
        }
    }

    fn parse_or<T: Record>(&mut self) -> Result<Expr<T>, FilterError> {
        let mut terms = vec![self.parse_and()?];
        while self.eat_word("or") {
            terms.push(self.parse_and()?);
        }
        Ok(if terms.len() == 1 {
            terms.swap_remove(0)
        } else {
            Expr::Any(terms)
        })
    }

    fn parse_and<T: Record>(&mut self) -> Result<Expr<T>, FilterError> {
        let mut terms = vec![self.parse_not()?];
        while self.eat_word("and") {
            terms.push(self.parse_not()?);
        }
        Ok(if terms.len() == 1 {
            terms.swap_remove(0)
        } else {
            Expr::All(terms)
        })
    }

    fn parse_not<T: Record>(&mut self) -> Result<Expr<T>, FilterError> {
        let mut negate = false;
        while self.eat_word("not") {
            negate = !negate;
        }
        let e = self.parse_primary()?;
        Ok(if negate { Expr::Not(Box::new(e)) } else { e })
    }

    fn parse_primary<T: Record>(&mut self) -> Result<Expr<T>, FilterError> {
        match self.peek_tok() {
            Some(Tok::LParen) => {
                let open = self.offset();
                if self.depth == MAX_DEPTH {
                    return Err(FilterError::TooDeep {
                        offset: open,
                        max: MAX_DEPTH,
                    });
                }
                self.pos += 1;
                self.depth += 1;
                let e = self.parse_or()?;
                self.depth -= 1;
                if !self.eat(&Tok::RParen) {
                    return Err(FilterError::Unclosed {
                        open,
                        offset: self.offset(),
                        found: self.found(),
                    });
                }
                Ok(e)
            }
            Some(Tok::Word(w)) if !is_connective(w) => self.parse_match(),
            Some(Tok::Str(_)) => self.parse_match(),
            _ => Err(self.expected(format!("an expression{}", self.after_previous()))),
        }
    }

    /// A matching expression; the next token is a word or a string.
    fn parse_match<T: Record>(&mut self) -> Result<Expr<T>, FilterError> {
        let Some(first) = self.bump() else {
            return Err(self.expected("an expression".to_owned()));
        };
        // A bracket index makes the first operand a map selector: `Service.Meta["k"]`.
        let key = if matches!(first.tok, Tok::Word(_)) {
            self.parse_index()?
        } else {
            None
        };
        let first_end = self.previous_end();
        let first_text = &self.src[first.start..first_end];
        let op_offset = self.offset();
        let op = self.parse_operator(first_text)?;

        if matches!(op, Op::In | Op::NotIn) {
            // `Value in Selector`.
            let value = match first.tok {
                Tok::Word(w) if key.is_none() => w,
                Tok::Str(s) => s,
                _ => {
                    return Err(FilterError::Syntax {
                        offset: first.start,
                        expected: format!("a value before \"{}\"", op.as_str()),
                        found: format!("selector {first_text}"),
                    });
                }
            };
            let field = self.parse_selector(op, op_offset)?;
            return Ok(Expr::Match(Match {
                field,
                test: Test::Contains(value),
                negate: op.negated(),
            }));
        }

        // `Selector op [Value]`.
        let Tok::Word(path) = first.tok else {
            return Err(FilterError::Syntax {
                offset: first.start,
                expected: format!("a selector before \"{}\"", op.as_str()),
                found: format!("string {first_text}"),
            });
        };
        let field = Self::resolve(&path, key, first.start, first_text)?;
        self.check_operator(&field, op, op_offset, first_text)?;
        let test = match op {
            Op::IsEmpty | Op::IsNotEmpty => Test::IsEmpty,
            Op::Contains | Op::NotContains | Op::In | Op::NotIn => Test::Contains(self.parse_value()?.0),
            Op::Matches | Op::NotMatches => {
                let (pattern, at) = self.parse_value()?;
                Test::Matches(compile(pattern, at)?)
            }
            Op::Equal | Op::NotEqual => {
                let (value, at) = self.parse_value()?;
                Test::Equals(coerce(&field, value, at, first_text)?)
            }
        };
        Ok(Expr::Match(Match {
            field,
            test,
            negate: op.negated(),
        }))
    }

    /// An optional bracket index after a selector word: `["key"]`.
    fn parse_index(&mut self) -> Result<Option<String>, FilterError> {
        if !self.eat(&Tok::LBracket) {
            return Ok(None);
        }
        let Some(Tok::Str(key)) = self.peek_tok().cloned() else {
            return Err(self.expected("a quoted map key after \"[\"".to_owned()));
        };
        self.pos += 1;
        if !self.eat(&Tok::RBracket) {
            return Err(self.expected("\"]\" after the map key".to_owned()));
        }
        Ok(Some(key))
    }

    /// End offset of the last token consumed.
    fn previous_end(&self) -> usize {
        self.pos
            .checked_sub(1)
            .and_then(|p| self.tokens.get(p))
            .map_or(0, |t| t.end)
    }

    /// The operator after the first operand of a matching expression.
    fn parse_operator(&mut self, first: &str) -> Result<Op, FilterError> {
        let op = match self.peek_tok() {
            Some(Tok::Equal) => Op::Equal,
            Some(Tok::NotEqual) => Op::NotEqual,
            Some(Tok::Word(w)) => match w.as_str() {
                "in" => Op::In,
                "contains" => Op::Contains,
                "matches" => Op::Matches,
                "is" => {
                    self.pos += 1;
                    if self.eat_word("empty") {
                        return Ok(Op::IsEmpty);
                    }
                    if self.eat_word("not") {
                        if self.eat_word("empty") {
                            return Ok(Op::IsNotEmpty);
                        }
                        return Err(self.expected("\"empty\" after \"is not\"".to_owned()));
                    }
                    return Err(self.expected("\"empty\" or \"not empty\" after \"is\"".to_owned()));
                }
                "not" => {
                    self.pos += 1;
                    let op = match self.peek_tok() {
                        Some(Tok::Word(w)) if w == "in" => Op::NotIn,
                        Some(Tok::Word(w)) if w == "contains" => Op::NotContains,
                        Some(Tok::Word(w)) if w == "matches" => Op::NotMatches,
                        _ => {
                            return Err(self.expected("\"in\", \"contains\" or \"matches\" after \"not\"".to_owned()));
                        }
                    };
                    self.pos += 1;
                    return Ok(op);
                }
                _ => return Err(self.missing_operator(first)),
            },
            _ => return Err(self.missing_operator(first)),
        };
        self.pos += 1;
        Ok(op)
    }

    fn missing_operator(&self, first: &str) -> FilterError {
        self.expected(format!(
            "an operator (==, !=, in, not in, contains, not contains, matches, not matches, is empty, is not empty) after \"{first}\""
        ))
    }

    /// The selector after `in` / `not in`.
    fn parse_selector<T: Record>(&mut self, op: Op, op_offset: usize) -> Result<Field<T>, FilterError> {
        let Some(Token {
            tok: Tok::Word(path),
            start,
            ..
        }) = self.peek().cloned()
        else {
            return Err(self.expected(format!("a selector{}", self.after_previous())));
        };
        self.pos += 1;
        let key = self.parse_index()?;
        let text = &self.src[start..self.previous_end()];
        let field = Self::resolve(&path, key, start, text)?;
        self.check_operator(&field, op, op_offset, text)?;
        Ok(field)
    }

    fn resolve<T: Record>(path: &str, key: Option<String>, offset: usize, text: &str) -> Result<Field<T>, FilterError> {
        Field::resolve(path, key).ok_or_else(|| FilterError::UnknownSelector {
            offset,
            selector: text.to_owned(),
            known: records::known::<T>(),
        })
    }

    fn check_operator<T: Record>(
        &self,
        field: &Field<T>,
        op: Op,
        offset: usize,
        text: &str,
    ) -> Result<(), FilterError> {
        if takes(field, op) {
            return Ok(());
        }
        let (kind, supported) = field.kind();
        Err(FilterError::UnsupportedOperator {
            offset,
            operator: op.as_str(),
            selector: text.to_owned(),
            kind,
            supported,
        })
    }

    /// The value after an operator, unquoted, with its offset.
    fn parse_value(&mut self) -> Result<(String, usize), FilterError> {
        match self.peek().cloned() {
            Some(Token { tok: Tok::Word(v), .. }) if is_connective(&v) => Err(self.expected(format!(
                "a value{} (quote \"{v}\" to compare with it)",
                self.after_previous()
            ))),
            Some(Token {
                tok: Tok::Word(v) | Tok::Str(v),
                start,
                ..
            }) => {
                self.pos += 1;
                Ok((v, start))
            }
            _ => Err(self.expected(format!("a value{}", self.after_previous()))),
        }
    }
}

/// Whether `op` applies to `field`: strings take every operator, integers and booleans
/// the equalities, lists and maps membership and emptiness.
fn takes<T: Record>(field: &Field<T>, op: Op) -> bool {
    if field.is_string() {
        return true;
    }
    if field.integer_max().is_some() || field.is_boolean() {
        return matches!(op, Op::Equal | Op::NotEqual);
    }
    matches!(
        op,
        Op::In | Op::NotIn | Op::Contains | Op::NotContains | Op::IsEmpty | Op::IsNotEmpty
    )
}

/// `and` and `or` never start an operand: unquoted, they are always read as connectives.
fn is_connective(word: &str) -> bool {
    matches!(word, "and" | "or")
}

fn compile(pattern: String, offset: usize) -> Result<Regex, FilterError> {
    RegexBuilder::new(&pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            // The regex crate's syntax errors span lines (pattern, caret, message): keep the message.
            let text = e.to_string();
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(&text);
            let reason = last.trim().trim_start_matches("error: ").to_owned();
            FilterError::InvalidRegex {
                offset,
                pattern,
                reason,
            }
        })
}

/// Go's `strconv.ParseBool` spellings.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn coerce<T: Record>(field: &Field<T>, value: String, offset: usize, selector: &str) -> Result<Value, FilterError> {
    let invalid = |value: String, expected: String| FilterError::InvalidValue {
        offset,
        value,
        selector: selector.to_owned(),
        expected,
    };
    if let Some(max) = field.integer_max() {
        return match value.parse::<u64>() {
            Ok(n) if n <= max => Ok(Value::Integer(n)),
            _ => Err(invalid(value, format!("an integer from 0 to {max}"))),
        };
    }
    if field.is_boolean() {
        return match parse_bool(&value) {
            Some(b) => Ok(Value::Boolean(b)),
            None => Err(invalid(value, "true or false".to_owned())),
        };
    }
    Ok(Value::Text(value))
}

#[cfg(test)]
mod tests;
