//! JSON Schema to a [`Grammar`] of the JSON texts the schema accepts: exactly, or refused.
//!
//! Supported: `type` (one or a list), `properties`, `required`, `additionalProperties`
//! (false, true or a schema), `items`, `prefixItems`, `minItems`, `maxItems`, `enum`,
//! `const`, `anyOf`, `oneOf` (alternatives shown disjoint (`disjoint`: kinds, listed
//! values, ranges, patterns, a required property's schemas), or each intersected with the
//! negation of those it may overlap), `not` (of `type`s, `{}`/`true`/`false`, one bound or
//! length, `required`/`properties` of objects, or a double negation), `patternProperties`
//! (keys matching several patterns take all their schemas, up to `MAX_PATTERNS`),
//! `propertyNames` (string keywords, `const`/`enum`, booleans), `minProperties`/
//! `maxProperties`, `contains` with `minContains` (counted; `maxContains` refused),
//! `uniqueItems` (false; true on arrays of at most one item, or of items from at most 8
//! listed scalars), `dependentRequired`/`dependentSchemas`/`dependencies` (expanded over at
//! most `MAX_DEP_TRIGGERS` (5) triggers), `if`/`then`/`else` (where `if` has a negation, or
//! without `then`), `allOf` (one member, or members merged: properties joined, bounds to
//! the tighter, enums intersected, two anyOf multiplied out), `$ref` into the same document
//! (any JSON pointer; recursion allowed; beside other keywords an `allOf`, except in drafts
//! 3 to 7, where `$schema` says so and `$ref` overrides its siblings), `$defs`/
//! `definitions`, `pattern`, `minLength`, `maxLength`, `format` (each exactly its RFC's
//! grammar: date, time, date-time, duration, uuid, ipv4, ipv6, email, uri, uri-reference,
//! iri, iri-reference, uri-template, json-pointer, relative-json-pointer, `formats.rs`;
//! hostname, idn-hostname, idn-email and regex are refused; an annotation with
//! `format_assertion` off), `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`
//! and `multipleOf` (a remainder automaton, `multiple_of.rs`). Without `type`, every kind
//! is allowed, each constrained by its own keywords (as the spec reads). Annotations and
//! keywords outside the JSON Schema vocabularies (`x-...`, `example`) are ignored, as the
//! spec ignores unknown keywords.
//!
//! Numbers are compared by value, as decimals (exactly, not as doubles). `integer` is any
//! number whose value is an integer: a zero fraction is accepted everywhere (`1.0`,
//! `-3.00`, `-0`), under bounds and `multipleOf` too (the value counts). Exponents are a
//! spelling: the texts with an exponent whose value is an integer are not a regular
//! language (`100e-2` is 1: the exponent's value must be weighed against a count of
//! digits), so an integer with an exponent is accepted only as floats print it (one integer digit, at most 16 fraction digits, an exponent of at least their
//! count, a finite double: `1.5e+17`, `1e+308`), exactly also under `multipleOf` (the
//! mantissa's remainder), and not under `minimum`/`maximum`. In drafts 3 and 4 an integer
//! is written without a fraction or an exponent (`1.0` is not one there). `enum`/`const`
//! numbers take a zero fraction, trailing fraction zeros and `-0` for 0.
//!
//! Exactness: whatever cannot be compiled exactly is an [`Approximation`] naming the
//! keyword, its location and how the grammar differs (subset, superset, neither). With
//! [`JsonOptions::strict`] (the default) the first one is an error
//! ([`GrammarError::Inexact`]); without, the approximation is compiled and listed. One kind
//! is listed and never refused: spellings ([`Kind::Spelling`]: integers with exponents as
//! above, bounded numbers without exponents, `\u` escapes only for control characters in
//! strings under `pattern` or `format`: every value keeps a spelling).
//!
//! Objects: properties in any order, each at most once, every required one present, counted
//! for `minProperties`/`maxProperties` (a member set: the parser tracks the members used, so
//! the grammar stays linear in the properties), or in declared order with
//! [`PropertyOrder::Declared`]. Keys and string values under `pattern` are automata over
//! characters read through JSON's escapes; the separators and the whitespace around
//! punctuation follow [`JsonOptions`].

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::cfg::{Grammar, GrammarBuilder, GrammarLimits, Sym, MAX_SET_COUNT, MAX_SET_MEMBERS};
use super::formats;
use super::int_range::int_range_regex;
use super::multiple_of::{self, multiple_of_dfa};
use crate::constrain::{GrammarError, TableDfa};

/// How JSON texts are laid out.
#[derive(Debug, Clone)]
pub struct JsonOptions {
    /// Any whitespace (`[ \t\n\r]*`) around punctuation; otherwise exactly the separators.
    pub whitespace: bool,
    /// Between items and between properties (`","` with flexible whitespace).
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    /// Objects without `additionalProperties` allow no other properties (as if `false`).
    pub closed: bool,
    /// The order properties may come in.
    pub property_order: PropertyOrder,
    /// Refuse a schema that cannot be compiled exactly ([`GrammarError::Inexact`] naming
    /// the first such keyword); otherwise compile an approximation and list it
    /// ([`Approximation`]). Spelling restrictions ([`Kind::Spelling`]) are listed, never
    /// refused.
    pub strict: bool,
    /// `format` asserts its format (else it is an annotation, as JSON Schema 2020-12 reads
    /// it by default).
    pub format_assertion: bool,
}

/// How an approximation's language relates to the schema's valid documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Some valid documents are rejected, no invalid one accepted.
    Subset,
    /// Every valid document is accepted, and some invalid ones.
    Superset,
    /// Some of each.
    Neither,
    /// Values are all reachable but some spellings are not (numbers without exponents,
    /// string values under `pattern` or `format` without escape sequences).
    Spelling,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Subset => "subset",
            Kind::Superset => "superset",
            Kind::Neither => "neither",
            Kind::Spelling => "spelling",
        }
    }

    /// Does `strict` refuse it?
    fn refused(self) -> bool {
        matches!(self, Kind::Subset | Kind::Superset | Kind::Neither)
    }
}

/// One place where the compiled grammar differs from the schema.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Approximation {
    pub keyword: String,
    /// The schema's location, a JSON pointer as a URI fragment (`#/properties/a`).
    pub pointer: String,
    pub kind: Kind,
    pub detail: String,
}

/// The order an object's properties may come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertyOrder {
    /// Any order (each at most once), as JSON Schema reads objects.
    Any,
    /// Declared properties in declared order, others after them (OpenAI-style structured
    /// output): a subset of the valid documents.
    Declared,
}

impl Default for JsonOptions {
    fn default() -> Self {
        JsonOptions {
            whitespace: true,
            item_separator: ",".into(),
            key_separator: ":".into(),
            closed: false,
            property_order: PropertyOrder::Any,
            strict: true,
            format_assertion: true,
        }
    }
}

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];

const STRING_CHAR: &str = r#"(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))"#;
const STRING: &str = r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#;
const NUMBER: &str = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?";
const INTEGER: &str = r"-?(?:0|[1-9][0-9]*)";
const WS: &str = r"[ \t\n\r]*";

/// Compile `schema` (a JSON Schema document) to a grammar, with the approximations it took
/// (with `opts.strict`, an error at the first one strict mode refuses).
pub fn compile(
    schema: &Value,
    opts: &JsonOptions,
    limits: GrammarLimits,
) -> Result<(Grammar, Vec<Approximation>), GrammarError> {
    let mut c = Compiler {
        b: GrammarBuilder::new(limits),
        root: schema,
        opts: opts.clone(),
        refs: HashMap::new(),
        pending: Vec::new(),
        approximations: Vec::new(),
        listed: Vec::new(),
        any: None,
        ref_overrides: legacy_ref(schema),
        legacy_integer: draft_before_6(schema),
    };
    if let Some(uri) = schema.get("$schema").and_then(Value::as_str) {
        if !known_metaschema(uri) {
            let detail = "a metaschema this compiler does not know: its vocabularies may differ";
            c.inexact("$schema", "#", Kind::Neither, detail);
        }
    }
    let top = c.schema(schema, "#", 0)?;
    while let Some((nt, path)) = c.pending.pop() {
        let target = resolve(c.root, &path)?;
        let sym = c.schema(target, &path, 0)?;
        c.b.rule(nt, vec![sym])?;
    }
    if let Some(a) = c.approximations.first().filter(|_| opts.strict) {
        let others = c.approximations.len() - 1;
        let detail = match others {
            0 => a.detail.clone(),
            n => format!("{} ({n} more inexact places)", a.detail),
        };
        return Err(GrammarError::Inexact {
            keyword: a.keyword.clone(),
            pointer: a.pointer.clone(),
            detail,
        });
    }
    let listed = std::mem::take(&mut c.listed);
    c.approximations.extend(listed);
    c.approximations.sort();
    c.approximations.dedup();
    let root = c.b.nonterminal("root");
    let ws = c.ws_lexeme()?;
    let mut rhs = vec![top];
    if let Some(w) = ws {
        rhs = vec![w, top, w];
    }
    c.b.rule(root, rhs)?;
    Ok((c.b.build(root)?, c.approximations))
}

/// The sub-schema at `#/a/b` (JSON pointer, `~0`/`~1` escapes) of `root`.
fn resolve<'a>(root: &'a Value, reference: &str) -> Result<&'a Value, GrammarError> {
    let Some(pointer) = reference.strip_prefix('#') else {
        return Err(GrammarError::Unsupported(format!(
            "$ref {reference:?} (only references into the same document, starting with '#')"
        )));
    };
    let pointer = pointer.replace("%25", "%");
    root.pointer(&pointer)
        .ok_or_else(|| GrammarError::Grammar(format!("$ref {reference:?} points to nothing")))
}

/// A schema valid exactly where `n` is not, for the forms that have one here: booleans,
/// `{}`, `type` lists (not `integer` without `number`: its complement within numbers is not
/// regular), double negations, and one numeric bound or string length on its own.
fn negation(n: &Value) -> Option<Value> {
    let only = |k: &str| {
        n.as_object()
            .is_some_and(|o| o.contains_key(k) && o.keys().all(|x| x == k || ignored(x)))
    };
    if *n == Value::Bool(true) || n.as_object().is_some_and(|o| o.keys().all(|k| ignored(k))) {
        return Some(Value::Bool(false)); // nothing is valid
    }
    if *n == Value::Bool(false) {
        return Some(Value::Object(Map::new()));
    }
    if only("type") {
        let listed: Vec<&str> = match &n["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if listed.contains(&"integer") && !listed.contains(&"number") {
            return None;
        }
        let kinds: Vec<Value> = ["object", "array", "string", "number", "boolean", "null"]
            .iter()
            .filter(|k| !listed.contains(k))
            .map(|k| Value::String((*k).to_owned()))
            .collect();
        let mut t = Map::new();
        t.insert("type".into(), Value::Array(kinds));
        return Some(Value::Object(t));
    }
    if only("not") {
        return Some(n["not"].clone()); // double negation
    }
    // An object-only schema fails where the value is an object (if `type` says so) lacking
    // a required name, or holding a property that fails its schema. (Other kinds satisfy
    // `required` and `properties`, which only constrain objects.)
    let obj = n.as_object()?;
    let object_only = obj
        .keys()
        .all(|k| ["required", "type", "properties"].contains(&k.as_str()) || ignored(k))
        && obj.get("type").is_none_or(|t| t == "object")
        && (obj.contains_key("required") || obj.contains_key("properties"));
    if object_only {
        let one = |k: &str, v: Value| {
            let mut o = Map::new();
            o.insert(k.to_owned(), v);
            o
        };
        let mut fails: Vec<Value> = Vec::new();
        if obj.contains_key("type") {
            fails.push(json_kinds_but("object"));
        }
        if let Some(names) = obj.get("required") {
            for name in names.as_array()? {
                let absent = one(name.as_str()?, Value::Bool(false));
                fails.push(Value::Object(one("properties", Value::Object(absent))));
            }
        }
        if let Some(props) = obj.get("properties") {
            for (p, ps) in props.as_object()? {
                let violated = negation(ps)?;
                if violated == Value::Bool(false) {
                    continue; // a schema every value satisfies
                }
                let mut o = one("properties", Value::Object(one(p, violated)));
                o.insert(
                    "required".into(),
                    Value::Array(vec![Value::String(p.clone())]),
                );
                fails.push(Value::Object(o));
            }
        }
        return match fails.len() {
            0 => Some(Value::Bool(false)),
            1 => fails.pop(),
            _ => Some(Value::Object(one("anyOf", Value::Array(fails)))),
        };
    }
    // One bound: values of its kind on the other side of it (other kinds satisfy the bound,
    // so they fail its negation).
    let flipped = [
        ("minimum", "exclusiveMaximum", "number"),
        ("exclusiveMinimum", "maximum", "number"),
        ("maximum", "exclusiveMinimum", "number"),
        ("exclusiveMaximum", "minimum", "number"),
        ("minLength", "maxLength", "string"),
        ("maxLength", "minLength", "string"),
    ];
    for (key, other, kind) in flipped {
        if !only(key) {
            continue;
        }
        let v = &n[key];
        let bound = match kind {
            "number" => v.as_f64().filter(|x| x.is_finite()).map(|_| v.clone())?,
            // Lengths are integers: not (length >= a) is length <= a - 1, and so on.
            _ => {
                let a = v.as_u64()?;
                match key {
                    "minLength" if a == 0 => return Some(Value::Bool(false)),
                    "minLength" => Value::from(a - 1),
                    _ => Value::from(a.checked_add(1)?),
                }
            }
        };
        let mut kind_schema = Map::new();
        kind_schema.insert("type".into(), Value::String(kind.to_owned()));
        kind_schema.insert(other.into(), bound);
        return Some(Value::Object(kind_schema));
    }
    None
}

/// `{"type": [every kind but `kind`]}`.
fn json_kinds_but(kind: &str) -> Value {
    let kinds: Vec<Value> = ["object", "array", "string", "number", "boolean", "null"]
        .iter()
        .filter(|k| **k != kind)
        .map(|k| Value::String((*k).to_owned()))
        .collect();
    let mut t = Map::new();
    t.insert("type".into(), Value::Array(kinds));
    Value::Object(t)
}

/// The JSON kinds a schema's `type`, `const` or `enum` admit (`integer` read as `number`);
/// `None`: every kind (or not known here).
fn kinds_of(s: &Value) -> Option<Vec<&'static str>> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let o = match s {
        Value::Bool(false) => return Some(Vec::new()),
        Value::Object(o) => o,
        _ => return None,
    };
    let mut out: Option<Vec<&'static str>> = None;
    let mut meet = |ks: Vec<&'static str>| {
        out = Some(match out.take() {
            None => ks,
            Some(prev) => prev.into_iter().filter(|k| ks.contains(k)).collect(),
        });
    };
    if let Some(t) = o.get("type") {
        let listed: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return None,
        };
        let all = ["object", "array", "string", "number", "boolean", "null"];
        meet(
            all.iter()
                .copied()
                .filter(|k| listed.contains(k) || (*k == "number" && listed.contains(&"integer")))
                .collect(),
        );
    }
    if let Some(c) = o.get("const") {
        meet(vec![kind(c)]);
    }
    if let Some(Value::Array(e)) = o.get("enum") {
        let mut ks: Vec<&'static str> = e.iter().map(kind).collect();
        ks.dedup();
        meet(ks);
    }
    out
}

/// The values a schema lists (`const`, or `enum`), if it does.
fn listed_values(s: &Value) -> Option<Vec<Value>> {
    match (s.get("const"), s.get("enum")) {
        (Some(c), _) => Some(vec![c.clone()]),
        (None, Some(Value::Array(e))) => Some(e.clone()),
        _ => None,
    }
}

/// Can no JSON value satisfy both `a` and `b`? `false` when not shown here: disjoint kinds,
/// disjoint listed values, disjoint length or number ranges, or objects that both require
/// a property whose listed values differ, or where one requires a property the other
/// forbids.
fn disjoint(a: &Value, b: &Value, limits: crate::constrain::RegexLimits) -> bool {
    disjoint_within(a, b, 4, limits)
}

/// [`disjoint`], looking `depth` levels of properties down.
fn disjoint_within(
    a: &Value,
    b: &Value,
    depth: usize,
    limits: crate::constrain::RegexLimits,
) -> bool {
    if let (Some(x), Some(y)) = (listed_values(a), listed_values(b)) {
        let same = |u: &Value, v: &Value| match (u.as_f64(), v.as_f64()) {
            (Some(p), Some(q)) => p == q,
            _ => u == v,
        };
        if !x.iter().any(|u| y.iter().any(|v| same(u, v))) {
            return true;
        }
    }
    let (ka, kb) = (kinds_of(a), kinds_of(b));
    let common: Vec<&str> = match (&ka, &kb) {
        (Some(x), Some(y)) => x.iter().copied().filter(|k| y.contains(k)).collect(),
        (Some(x), None) | (None, Some(x)) => x.clone(),
        (None, None) => vec!["object", "array", "string", "number", "boolean", "null"],
    };
    if common.is_empty() {
        return true;
    }
    // Ranges that cannot meet (for the one kind both allow).
    let num = |s: &Value, k: &str| s.get(k).and_then(Value::as_f64);
    let apart = |lo: &[&str], hi: &[&str]| {
        let top = hi
            .iter()
            .filter_map(|k| num(a, k))
            .fold(f64::INFINITY, f64::min);
        let bottom = lo
            .iter()
            .filter_map(|k| num(b, k))
            .fold(f64::NEG_INFINITY, f64::max);
        top < bottom
    };
    let ranges_apart = |lo: &[&str], hi: &[&str]| {
        apart(lo, hi) || {
            let top = hi
                .iter()
                .filter_map(|k| num(b, k))
                .fold(f64::INFINITY, f64::min);
            let bottom = lo
                .iter()
                .filter_map(|k| num(a, k))
                .fold(f64::NEG_INFINITY, f64::max);
            top < bottom
        }
    };
    if common == ["string"] && ranges_apart(&["minLength"], &["maxLength"]) {
        return true;
    }
    // Two patterns no string matches both of.
    let pattern = |s: &Value| s.get("pattern").and_then(Value::as_str).map(str::to_owned);
    if let (true, Some(p), Some(q)) = (common == ["string"], pattern(a), pattern(b)) {
        let dfa =
            |p: &str| TableDfa::compile(&format!("(?s:.)*(?:{})(?s:.)*", ecma_classes(p)), limits);
        if let (Ok(x), Ok(y)) = (dfa(&p), dfa(&q)) {
            if let Ok(both) = x.intersect(&y, limits) {
                if !both.states().any(|st| both.is_accepting(st)) {
                    return true;
                }
            }
        }
    }
    let (lo, hi) = (
        ["minimum", "exclusiveMinimum"],
        ["maximum", "exclusiveMaximum"],
    );
    if common == ["number"] && ranges_apart(&lo, &hi) {
        return true;
    }
    if common != ["object"] {
        return false;
    }
    let required = |s: &Value| -> Vec<String> {
        s.get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let prop = |s: &Value, p: &str| s.get("properties").and_then(|ps| ps.get(p)).cloned();
    let forbids = |s: &Value, p: &str| match prop(s, p) {
        Some(Value::Bool(false)) => true,
        Some(_) => false,
        None => {
            s.get("additionalProperties") == Some(&Value::Bool(false))
                && s.get("patternProperties").is_none()
        }
    };
    let (ra, rb) = (required(a), required(b));
    if ra.iter().any(|p| forbids(b, p)) || rb.iter().any(|p| forbids(a, p)) {
        return true;
    }
    // A property both require, whose schemas no value satisfies together.
    ra.iter().filter(|p| rb.contains(p)).any(|p| {
        let (Some(x), Some(y)) = (prop(a, p), prop(b, p)) else {
            return false;
        };
        depth > 0 && disjoint_within(&x, &y, depth - 1, limits)
    })
}

/// The automaton of every UTF-8 text, `(?s:.)*` (built once).
fn any_text(limits: crate::constrain::RegexLimits) -> Result<TableDfa, GrammarError> {
    static ANY: std::sync::OnceLock<TableDfa> = std::sync::OnceLock::new();
    if let Some(d) = ANY.get() {
        return Ok(d.clone());
    }
    let d = TableDfa::compile("(?s:.)*", limits)?;
    Ok(ANY.get_or_init(|| d).clone())
}

/// Where a JSON string's content is inside an escape sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Escape {
    /// Before the opening quote (`quoted`).
    Open,
    Plain,
    /// After the closing quote.
    Closed,
    Backslash,
    U,
    U0,
    U00,
    /// `\u00` and the code point's high hex digit (0 or 1).
    U00x(u8),
}

/// The automaton of the JSON string contents (between the quotes) whose characters `d`
/// accepts: characters written as themselves (except `"`, `\` and controls), as one of
/// the short escapes, or as `\u00XX` for controls (so every string has a spelling; other
/// `\u` spellings are not accepted).
fn json_escaped(d: &TableDfa, quoted: bool) -> TableDfa {
    use crate::constrain::regex::StateId;
    const SHORT: [(u8, u8); 8] = [
        (b'"', b'"'),
        (b'\\', b'\\'),
        (b'/', b'/'),
        (b'b', 0x08),
        (b'f', 0x0C),
        (b'n', b'\n'),
        (b'r', b'\r'),
        (b't', b'\t'),
    ];
    let dead = crate::constrain::regex::DEAD;
    // Escape states are shared by the states of `d` that escapes take to the same places
    // (their signature: where each escaped character leads), so a set of names, whose
    // states mostly send `"`, `\\` and controls to one place, stays small.
    let mut sigs: HashMap<Vec<StateId>, usize> = HashMap::new();
    let mut sig_targets: Vec<Vec<StateId>> = Vec::new();
    // Node: (d state or signature, escape position); dense ids per kind.
    let mut q_ids: Vec<u32> = vec![0; d.num_states() * 3];
    let mut chain_ids: HashMap<(usize, Escape), u32> = HashMap::new();
    let mut order: Vec<(usize, Escape)> = Vec::new();
    let mut edges: Vec<[u32; 256]> = vec![[0; 256]];
    let mut accepting = vec![false];
    let code = |e: Escape| match e {
        Escape::Open => 0,
        Escape::Plain => 1,
        _ => 2,
    };
    let mut node = |key: usize, e: Escape, order: &mut Vec<(usize, Escape)>| -> u32 {
        let slot = match e {
            Escape::Open | Escape::Plain | Escape::Closed => &mut q_ids[key * 3 + code(e)],
            _ => chain_ids.entry((key, e)).or_insert(0),
        };
        if *slot == 0 {
            order.push((key, e));
            *slot = order.len() as u32;
        }
        *slot
    };
    let first = if quoted { Escape::Open } else { Escape::Plain };
    node(d.start().index(), first, &mut order);
    let mut i = 0;
    while i < order.len() {
        let (key, e) = order[i];
        let mut row = [0u32; 256];
        let q = StateId::from_index(key);
        macro_rules! to {
            ($t:expr) => {{
                let t: StateId = $t;
                if t == dead {
                    0
                } else {
                    node(t.index(), Escape::Plain, &mut order)
                }
            }};
        }
        match e {
            Escape::Open => row[b'"' as usize] = to!(q),
            Escape::Closed => {}
            Escape::Plain => {
                for b in 0x20..=255u8 {
                    row[b as usize] = match b {
                        b'"' if quoted && d.is_accepting(q) => {
                            node(key, Escape::Closed, &mut order)
                        }
                        b'"' => 0,
                        b'\\' => {
                            let sig: Vec<StateId> = (SHORT.iter().map(|&(_, c)| d.next(q, c)))
                                .chain((0..0x20u8).map(|c| d.next(q, c)))
                                .collect();
                            if sig.iter().all(|&t| t == dead) {
                                0
                            } else {
                                let n = sigs.len();
                                let id = *sigs.entry(sig.clone()).or_insert_with(|| {
                                    sig_targets.push(sig);
                                    n
                                });
                                node(id, Escape::Backslash, &mut order)
                            }
                        }
                        _ => to!(d.next(q, b)),
                    };
                }
            }
            Escape::Backslash => {
                let t = sig_targets[key].clone();
                for (k, &(c, _)) in SHORT.iter().enumerate() {
                    row[c as usize] = to!(t[k]);
                }
                if t[SHORT.len()..].iter().any(|&x| x != dead) {
                    row[b'u' as usize] = node(key, Escape::U, &mut order);
                }
            }
            Escape::U => row[b'0' as usize] = node(key, Escape::U0, &mut order),
            Escape::U0 => row[b'0' as usize] = node(key, Escape::U00, &mut order),
            Escape::U00 => {
                row[b'0' as usize] = node(key, Escape::U00x(0), &mut order);
                row[b'1' as usize] = node(key, Escape::U00x(1), &mut order);
            }
            Escape::U00x(x) => {
                let t = sig_targets[key].clone();
                for c in b"0123456789abcdefABCDEF" {
                    let h = (*c as char).to_digit(16).unwrap_or(0) as usize;
                    row[*c as usize] = to!(t[SHORT.len() + x as usize * 16 + h]);
                }
            }
        }
        edges.push(row);
        accepting.push(match (quoted, e) {
            (true, _) => e == Escape::Closed,
            (false, Escape::Plain) => d.is_accepting(q),
            _ => false,
        });
        i += 1;
    }
    TableDfa::from_edges(&edges, &accepting)
}

/// Does `v` hold an object of two members or more (whose order a regex would fix)?
fn has_object_pair(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.len() > 1 || o.values().any(has_object_pair),
        Value::Array(xs) => xs.iter().any(has_object_pair),
        _ => false,
    }
}

/// The schema whose one valid value is `v` (objects as closed objects of `const` members).
fn literal_schema(v: &Value) -> Value {
    let mut s = Map::new();
    match v {
        Value::Object(o) if has_object_pair(v) => {
            let props: Map<String, Value> = o
                .iter()
                .map(|(k, x)| (k.clone(), literal_schema(x)))
                .collect();
            let names: Vec<Value> = o.keys().map(|k| Value::String(k.clone())).collect();
            s.insert("type".into(), Value::String("object".into()));
            s.insert("properties".into(), Value::Object(props));
            s.insert("required".into(), Value::Array(names));
            s.insert("additionalProperties".into(), Value::Bool(false));
        }
        Value::Array(xs) if has_object_pair(v) => {
            let items: Vec<Value> = xs.iter().map(literal_schema).collect();
            s.insert("type".into(), Value::String("array".into()));
            s.insert("prefixItems".into(), Value::Array(items));
            s.insert("items".into(), Value::Bool(false));
            s.insert("minItems".into(), Value::from(xs.len()));
        }
        _ => {
            s.insert("const".into(), v.clone());
        }
    }
    Value::Object(s)
}

/// Most patternProperties combined (one key class per non-empty subset).
const MAX_PATTERNS: usize = 4;

/// Most alternatives an `allOf` of two `anyOf` expands to.
const MAX_PRODUCT: usize = 64;

/// The lexemes every JSON Schema grammar with the default options is made of (strings,
/// numbers, whitespace and punctuation), spelled as the compiler spells them: a vocabulary
/// prepares their automata and trie walks once for all the schemas it serves.
pub(crate) fn common_lexemes() -> Vec<String> {
    let mut out: Vec<String> = [STRING, NUMBER, INTEGER, WS].map(str::to_owned).to_vec();
    for p in ["{", "}", "[", "]", ",", ":"] {
        out.push(format!("{WS}{}{WS}", regex_escape(p)));
    }
    out
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| format!("\\x{{{:X}}}", c as u32))
        .collect()
}

struct Compiler<'a> {
    b: GrammarBuilder,
    root: &'a Value,
    opts: JsonOptions,
    /// `$ref` target -> its nonterminal (created on first use, defined from `pending`).
    refs: HashMap<String, u32>,
    pending: Vec<(u32, String)>,
    /// What strict mode refuses (in the order met).
    approximations: Vec<Approximation>,
    /// Spelling approximations (listed, not refused), one per keyword.
    listed: Vec<Approximation>,
    /// The nonterminal of an unconstrained JSON value, built on first use.
    any: Option<Sym>,
    /// Drafts 3 to 7: a `$ref` overrides its siblings (they are ignored).
    ref_overrides: bool,
    /// Drafts 3 and 4, where `integer` excludes numbers written with a fraction.
    legacy_integer: bool,
}

/// Is `uri` one of the JSON Schema drafts' metaschemas (3 to 2020-12)?
fn known_metaschema(uri: &str) -> bool {
    let uri = uri.trim_end_matches('#');
    let rest = (uri.strip_prefix("http://json-schema.org/"))
        .or_else(|| uri.strip_prefix("https://json-schema.org/"));
    let drafts = [
        "draft-03/schema",
        "draft-04/schema",
        "draft-06/schema",
        "draft-07/schema",
        "draft/2019-09/schema",
        "draft/2020-12/schema",
        "schema",
    ];
    rest.is_some_and(|r| drafts.contains(&r))
}

/// Does the document's `$schema` name draft 3, 4, 6 or 7, where `$ref` overrides its
/// sibling keywords? (Later drafts, and documents that name none, apply them beside it.)
fn draft_before_6(root: &Value) -> bool {
    let uri = root.get("$schema").and_then(Value::as_str).unwrap_or("");
    ["draft-03", "draft-04"].iter().any(|d| uri.contains(d))
}

fn legacy_ref(root: &Value) -> bool {
    let Some(uri) = root.get("$schema").and_then(Value::as_str) else {
        return false;
    };
    ["draft-03", "draft-04", "draft-06", "draft-07"]
        .iter()
        .any(|d| uri.contains(d))
}

impl Compiler<'_> {
    /// Record that the grammar at `path` differs from the schema by `kind`.
    fn inexact(&mut self, keyword: &str, path: &str, kind: Kind, detail: &str) {
        let a = Approximation {
            keyword: keyword.to_owned(),
            pointer: path.to_owned(),
            kind,
            detail: detail.to_owned(),
        };
        if kind.refused() {
            self.approximations.push(a);
        } else if !self
            .listed
            .iter()
            .any(|x| x.keyword == a.keyword && x.kind == kind)
        {
            self.listed.push(a);
        }
    }

    fn ws_regex(&self) -> &'static str {
        if self.opts.whitespace {
            WS
        } else {
            ""
        }
    }

    fn ws_lexeme(&mut self) -> Result<Option<Sym>, GrammarError> {
        if self.opts.whitespace {
            Ok(Some(self.b.lexeme(WS)?))
        } else {
            Ok(None)
        }
    }

    /// Punctuation `p` (a literal) with the configured whitespace on both sides.
    fn punct(&mut self, p: &str) -> Result<Sym, GrammarError> {
        let ws = self.ws_regex();
        let p = if self.opts.whitespace { p.trim() } else { p };
        self.b.lexeme(&format!("{ws}{}{ws}", regex_escape(p)))
    }

    fn item_sep(&mut self) -> Result<Sym, GrammarError> {
        let s = self.opts.item_separator.clone();
        self.punct(&s)
    }

    fn alt(&mut self, hint: &str, alts: Vec<Vec<Sym>>) -> Result<Sym, GrammarError> {
        let nt = self.b.fresh(hint);
        for a in alts {
            self.b.rule(nt, a)?;
        }
        Ok(Sym::Nt(nt))
    }

    fn schema(&mut self, s: &Value, path: &str, depth: usize) -> Result<Sym, GrammarError> {
        if depth > self.b.limits().max_depth {
            return Err(GrammarError::TooLarge(format!(
                "the schema nests deeper than {} at {path} (max_depth)",
                self.b.limits().max_depth
            )));
        }
        let obj = match s {
            Value::Bool(true) => return self.any_value(),
            Value::Bool(false) => return self.b.lexeme("[^\\x{0}-\\x{10FFFF}]"),
            Value::Object(o) => o,
            _ => {
                return Err(GrammarError::Grammar(format!(
                    "{path}: a schema must be an object or a boolean"
                )))
            }
        };
        // Keywords outside the JSON Schema vocabularies (`x-...`, `example`, draft-4 `id`)
        // are annotations (the spec ignores unknown keywords); only assertions and
        // applicators the compiler lacks are refused.
        for k in obj.keys() {
            if NOT_YET.contains(&k.as_str()) {
                self.inexact(k, path, Kind::Superset, "not compiled: ignored");
            }
        }
        if let Some(r) = obj.get("$ref") {
            let Some(r) = r.as_str() else {
                return Err(GrammarError::Grammar(format!(
                    "{path}: $ref must be a string"
                )));
            };
            let only_ref = obj.keys().all(|k| k == "$ref" || ignored(k));
            if !only_ref && !self.ref_overrides {
                // Since draft 2019-09 siblings of $ref apply beside it: an allOf.
                let mut rest = obj.clone();
                rest.remove("$ref");
                let mut reference = Map::new();
                reference.insert("$ref".into(), Value::String(r.to_owned()));
                let mut all = Map::new();
                all.insert(
                    "allOf".into(),
                    Value::Array(vec![Value::Object(reference), Value::Object(rest)]),
                );
                return self.schema(&Value::Object(all), path, depth + 1);
            }
            return self.reference(r);
        }
        if ["if", "then", "else"].iter().any(|k| obj.contains_key(*k)) {
            return self.conditional(obj, path, depth);
        }
        if ["dependentRequired", "dependentSchemas", "dependencies"]
            .iter()
            .any(|k| obj.contains_key(*k))
        {
            return self.dependencies(obj, path, depth);
        }
        if let Some(n) = obj.get("not") {
            let mut rest = obj.clone();
            rest.remove("not");
            let negated = negation(n);
            let Some(negated) = negated else {
                self.inexact(
                    "not",
                    path,
                    Kind::Superset,
                    "no schema for its negation here",
                );
                return self.any_value();
            };
            if negated == Value::Bool(false)
                || negated.as_object().is_some_and(|o| {
                    o.get("type")
                        .and_then(Value::as_array)
                        .is_some_and(|a| a.is_empty())
                })
            {
                return self.schema(&Value::Bool(false), path, depth);
            }
            let mut all = Map::new();
            all.insert(
                "allOf".into(),
                Value::Array(vec![Value::Object(rest), negated]),
            );
            return self.schema(&Value::Object(all), path, depth + 1);
        }
        if let Some(all) = obj.get("allOf") {
            let merged = self.merge_all_of(obj, all, path)?;
            return self.schema(&merged, path, depth + 1);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = obj.get(key) {
                let Some(alts) = alts.as_array().filter(|a| !a.is_empty()) else {
                    return Err(GrammarError::Grammar(format!(
                        "{path}: {key} must be a non-empty array"
                    )));
                };
                // oneOf: each alternative without the others it may overlap.
                let alts = &if key == "oneOf" {
                    self.exclusive(alts, obj, path)?
                } else {
                    alts.clone()
                };
                // Sibling keywords apply to every alternative.
                let mut base = obj.clone();
                base.remove(key);
                let mut syms = Vec::new();
                for (i, a) in alts.iter().enumerate() {
                    let sub = if base.keys().all(|k| ignored(k)) {
                        a.clone()
                    } else {
                        let mut all = Map::new();
                        all.insert(
                            "allOf".into(),
                            Value::Array(vec![Value::Object(base.clone()), a.clone()]),
                        );
                        Value::Object(all)
                    };
                    syms.push(vec![self.schema(
                        &sub,
                        &format!("{path}/{key}/{i}"),
                        depth + 1,
                    )?]);
                }
                return self.alt("anyOf", syms);
            }
        }
        // `type` beside `enum`/`const` filters the listed values.
        let type_ok = |v: &Value| -> bool {
            let kinds: Vec<&str> = match obj.get("type") {
                None => return true,
                Some(Value::String(t)) => vec![t.as_str()],
                Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
                Some(_) => return true,
            };
            let kind = match v {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            };
            let integral = v.as_f64().is_some_and(|x| x.fract() == 0.0);
            kinds.contains(&kind) || (kind == "number" && integral && kinds.contains(&"integer"))
        };
        if obj.contains_key("const") || obj.contains_key("enum") {
            // The listed values are taken as they are (only `type` filters them): keywords
            // compiled since would be skipped, so they are refused beside const/enum.
            for k in [
                "uniqueItems",
                "contains",
                "multipleOf",
                "propertyNames",
                "maxProperties",
            ] {
                if obj.contains_key(k) {
                    self.inexact(k, path, Kind::Superset, "beside const/enum: not checked");
                }
            }
        }
        if let Some(c) = obj.get("const") {
            if !type_ok(c) {
                return self.schema(&Value::Bool(false), path, depth);
            }
            return self.literal(c);
        }
        if let Some(e) = obj.get("enum") {
            let Some(vals) = e.as_array() else {
                return Err(GrammarError::Grammar(format!(
                    "{path}: enum must be an array"
                )));
            };
            let vals: Vec<&Value> = vals.iter().filter(|v| type_ok(v)).collect();
            if vals.is_empty() {
                // No value is allowed: the false schema.
                return self.schema(&Value::Bool(false), path, depth);
            }
            let mut alts = Vec::new();
            for v in vals {
                alts.push(vec![self.literal(v)?]);
            }
            return self.alt("enum", alts);
        }
        let types: Vec<&str> = match obj.get("type") {
            None => {
                // Without a type every kind is allowed, each constrained only by its own
                // keywords (`minimum` says nothing about strings).
                let kinds = [OBJECT_KEYS, ARRAY_KEYS, STRING_KEYS, NUMBER_KEYS];
                if !kinds.concat().iter().any(|k| obj.contains_key(*k)) {
                    return self.any_value();
                }
                vec!["object", "array", "string", "number", "boolean", "null"]
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(_) => {
                return Err(GrammarError::Grammar(format!("{path}: bad \"type\"")));
            }
        };
        let mut alts = Vec::new();
        for t in types {
            let sym = match t {
                "object" => self.object(obj, path, depth)?,
                "array" => self.array(obj, path, depth)?,
                "string" => self.string(obj, path)?,
                "number" => self.number(obj, path)?,
                "integer" => self.integer(obj, path)?,
                "boolean" => self.b.lexeme("true|false")?,
                "null" => self.b.lexeme("null")?,
                other => {
                    return Err(GrammarError::Grammar(format!(
                        "{path}: unknown type {other:?}"
                    )));
                }
            };
            alts.push(vec![sym]);
        }
        if alts.len() == 1 {
            return Ok(alts[0][0]);
        }
        self.alt("types", alts)
    }

    /// `if`/`then`/`else` as alternatives: `(if and then) or (not if and else)`, where
    /// `not if` has a schema ([`negation`]); `if` with only `else` is `if or else` (no
    /// negation needed), a lone `then`/`else` or a lone `if` asserts nothing.
    fn conditional(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Sym, GrammarError> {
        let mut rest = obj.clone();
        let (cond, then, other) = (rest.remove("if"), rest.remove("then"), rest.remove("else"));
        let rest = Value::Object(rest);
        let all = |parts: Vec<Value>| {
            let mut m = Map::new();
            m.insert("allOf".into(), Value::Array(parts));
            Value::Object(m)
        };
        let any = |parts: Vec<Value>| {
            let mut m = Map::new();
            m.insert("anyOf".into(), Value::Array(parts));
            Value::Object(m)
        };
        let expanded = match (cond, then, other) {
            (None, _, _) | (Some(_), None, None) => rest,
            (Some(Value::Bool(true)), Some(t), _) => all(vec![rest, t]),
            (Some(Value::Bool(true)), None, _) => rest,
            (Some(Value::Bool(false)), _, Some(e)) => all(vec![rest, e]),
            (Some(Value::Bool(false)), _, None) => rest,
            (Some(c), None, Some(e)) => any(vec![all(vec![rest.clone(), c]), all(vec![rest, e])]),
            (Some(c), then, other) => {
                let Some(not_c) = negation(&c) else {
                    self.inexact(
                        "if",
                        path,
                        Kind::Superset,
                        "with then, only an `if` whose negation has a schema (types, one bound \
                         or length, required names, booleans)",
                    );
                    return self.any_value();
                };
                let t = then.unwrap_or(Value::Bool(true));
                let e = other.unwrap_or(Value::Bool(true));
                any(vec![
                    all(vec![rest.clone(), c, t]),
                    all(vec![rest, not_c, e]),
                ])
            }
        };
        self.schema(&expanded, path, depth + 1)
    }

    /// `dependentRequired`, `dependentSchemas` (and draft-7 `dependencies`) by expansion:
    /// one alternative per subset of the trigger properties present (the others absent:
    /// declared `false`), each requiring its triggers' dependents and merging their
    /// schemas; non-objects take the schema without them. Refused past
    /// [`MAX_DEP_TRIGGERS`] triggers (2^n alternatives).
    fn dependencies(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Sym, GrammarError> {
        let mut rest = obj.clone();
        // trigger -> (dependent names, dependent schemas)
        let mut triggers: Vec<(String, Vec<Value>, Vec<Value>)> = Vec::new();
        let mut add = |name: &str, req: Option<Vec<Value>>, schema: Option<Value>| {
            let i = match triggers.iter().position(|t| t.0 == name) {
                Some(i) => i,
                None => {
                    triggers.push((name.to_owned(), Vec::new(), Vec::new()));
                    triggers.len() - 1
                }
            };
            triggers[i].1.extend(req.unwrap_or_default());
            triggers[i].2.extend(schema);
        };
        for key in ["dependentRequired", "dependentSchemas", "dependencies"] {
            let Some(v) = rest.remove(key) else { continue };
            let Value::Object(m) = v else {
                return Err(GrammarError::Grammar(format!(
                    "{path}: {key} must be an object"
                )));
            };
            for (name, d) in m {
                match (key, d) {
                    ("dependentRequired", Value::Array(r)) | ("dependencies", Value::Array(r)) => {
                        add(&name, Some(r), None)
                    }
                    ("dependentRequired", _) => {
                        return Err(GrammarError::Grammar(format!(
                            "{path}: dependentRequired values must be arrays"
                        )))
                    }
                    (_, s) => add(&name, None, Some(s)),
                }
            }
        }
        let kinds: Vec<String> = match rest.get("type") {
            None => ["object", "array", "string", "number", "boolean", "null"]
                .iter()
                .map(|k| (*k).to_owned())
                .collect(),
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
            Some(_) => return Err(GrammarError::Grammar(format!("{path}: bad \"type\""))),
        };
        if !kinds.iter().any(|k| k == "object") {
            return self.schema(&Value::Object(rest), path, depth + 1);
        }
        if triggers.len() > MAX_DEP_TRIGGERS {
            let detail = format!(
                "{} trigger properties: at most {MAX_DEP_TRIGGERS}",
                triggers.len()
            );
            self.inexact("dependentRequired", path, Kind::Superset, &detail);
            return self.any_value();
        }
        let mut alts = Vec::new();
        let others: Vec<Value> = kinds
            .iter()
            .filter(|k| *k != "object")
            .map(|k| Value::String(k.clone()))
            .collect();
        if !others.is_empty() {
            let mut o = rest.clone();
            o.insert("type".into(), Value::Array(others));
            alts.push(Value::Object(o));
        }
        let required: Vec<Value> = rest
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        'subsets: for mask in 0u32..(1 << triggers.len()) {
            let mut alt = rest.clone();
            alt.insert("type".into(), Value::String("object".into()));
            let mut req = required.clone();
            let mut props = match alt.get("properties") {
                Some(Value::Object(p)) => p.clone(),
                _ => Map::new(),
            };
            let mut parts = Vec::new();
            for (i, (name, dependents, schemas)) in triggers.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    // Dependents before their trigger: undeclared required names are
                    // generated in this order (a guess at the usual one; others are missed).
                    for r in dependents
                        .iter()
                        .cloned()
                        .chain(std::iter::once(Value::String(name.clone())))
                    {
                        if !req.contains(&r) {
                            req.push(r);
                        }
                    }
                    parts.extend(schemas.iter().cloned());
                } else {
                    if required.contains(&Value::String(name.clone())) {
                        continue 'subsets; // a required trigger is always present
                    }
                    props.insert(name.clone(), Value::Bool(false));
                }
            }
            if !props.is_empty() {
                alt.insert("properties".into(), Value::Object(props));
            }
            if !req.is_empty() {
                alt.insert("required".into(), Value::Array(req));
            }
            let alt = Value::Object(alt);
            if parts.is_empty() {
                alts.push(alt);
            } else {
                parts.insert(0, alt);
                let mut m = Map::new();
                m.insert("allOf".into(), Value::Array(parts));
                alts.push(Value::Object(m));
            }
        }
        let mut m = Map::new();
        m.insert("anyOf".into(), Value::Array(alts));
        self.schema(&Value::Object(m), path, depth + 1)
    }

    /// `oneOf` as alternatives that exclude each other: alternative i, and the negation
    /// of each other alternative it is not shown disjoint from ([`disjoint`]); refused
    /// where such a negation has no schema here ([`negation`]).
    fn exclusive(
        &mut self,
        alts: &[Value],
        outer: &Map<String, Value>,
        path: &str,
    ) -> Result<Vec<Value>, GrammarError> {
        let (mut resolved, mut bare) = (Vec::new(), Vec::new());
        for a in alts {
            let mut a = a;
            let mut hops = 0;
            while let Some(r) = a.get("$ref").and_then(Value::as_str) {
                let bare = a.as_object().is_some_and(|o| {
                    self.ref_overrides || o.keys().all(|k| k == "$ref" || ignored(k))
                });
                hops += 1;
                if !bare || hops > self.b.limits().max_depth {
                    break;
                }
                a = resolve(self.root, r)?;
            }
            bare.push(a.clone());
            // The sibling `type` and `required` hold for every alternative (for telling
            // them apart).
            let mut a = a.clone();
            if let Some(o) = a.as_object_mut() {
                if let Some(t) = outer.get("type") {
                    o.entry("type").or_insert_with(|| t.clone());
                }
                if let Some(Value::Array(r)) = outer.get("required") {
                    let req = o
                        .entry("required")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(req) = req {
                        req.extend(r.iter().cloned());
                    }
                }
            }
            resolved.push(a);
        }
        let mut out = Vec::new();
        for (i, a) in resolved.iter().enumerate() {
            let mut parts = vec![alts[i].clone()];
            for (j, b) in resolved.iter().enumerate() {
                if i == j || disjoint(a, b, self.b.limits().lexeme) {
                    continue;
                }
                match negation(&bare[j]) {
                    Some(n) => parts.push(n),
                    None => {
                        let detail =
                            format!("alternatives {i} and {j} may both hold (read as anyOf)");
                        self.inexact("oneOf", path, Kind::Superset, &detail);
                        return Ok(alts.to_vec());
                    }
                }
            }
            out.push(if parts.len() == 1 {
                parts.pop().expect("one part")
            } else {
                let mut m = Map::new();
                m.insert("allOf".into(), Value::Array(parts));
                Value::Object(m)
            });
        }
        Ok(out)
    }

    fn reference(&mut self, r: &str) -> Result<Sym, GrammarError> {
        if let Some(&nt) = self.refs.get(r) {
            return Ok(Sym::Nt(nt));
        }
        resolve(self.root, r)?;
        let nt = self.b.fresh(&format!("ref {r}"));
        self.refs.insert(r.to_owned(), nt);
        self.pending.push((nt, r.to_owned()));
        Ok(Sym::Nt(nt))
    }

    /// `allOf` (plus the sibling keywords) as one schema: a single member is inlined; object
    /// members are merged (properties joined, `required` united, `additionalProperties`
    /// false if any says so); anything else is unsupported.
    fn merge_all_of(
        &mut self,
        obj: &Map<String, Value>,
        all: &Value,
        path: &str,
    ) -> Result<Value, GrammarError> {
        let Some(members) = all.as_array().filter(|a| !a.is_empty()) else {
            return Err(GrammarError::Grammar(format!(
                "{path}: allOf must be a non-empty array"
            )));
        };
        let mut parts: Vec<Map<String, Value>> = Vec::new();
        let mut base = obj.clone();
        base.remove("allOf");
        parts.push(base);
        for m in members {
            let mut m = m;
            // Follow plain references so `allOf: [{$ref}, {...}]` merges (a cycle of bare
            // references has no schema to merge: bounded, it ends in an error).
            let mut hops = 0;
            while let Some(r) = m.get("$ref").and_then(Value::as_str) {
                hops += 1;
                if hops > self.b.limits().max_depth {
                    return Err(GrammarError::Grammar(format!(
                        "{path}: $ref {r:?} is part of a cycle of bare references"
                    )));
                }
                m = resolve(self.root, r)?;
            }
            match m {
                Value::Object(o) => parts.push(o.clone()),
                Value::Bool(true) => {}
                // Nothing satisfies a false member, so nothing satisfies the allOf.
                Value::Bool(false) => return Ok(Value::Bool(false)),
                _ => {
                    return Err(GrammarError::Grammar(format!(
                        "{path}: allOf members must be schemas"
                    )))
                }
            }
        }
        // if/then/else read each other only within one member: drop the ones that assert
        // nothing alone, and refuse them in two members (merging would pair them).
        let cond = ["if", "then", "else"];
        for p in parts.iter_mut() {
            if !p.contains_key("if") || !(p.contains_key("then") || p.contains_key("else")) {
                for k in cond {
                    p.remove(k);
                }
            }
        }
        if parts
            .iter()
            .filter(|p| cond.iter().any(|k| p.contains_key(*k)))
            .count()
            > 1
        {
            self.inexact("allOf", path, Kind::Neither, "if/then/else in two members");
        }
        // Keywords that read their siblings (items after prefixItems, additionalProperties
        // beside properties) would change meaning if merged across members.
        let has = |p: &Map<String, Value>, k: &str| p.contains_key(k);
        for (i, p) in parts.iter().enumerate() {
            for (j, q) in parts.iter().enumerate() {
                if i == j {
                    continue;
                }
                if has(p, "items") && has(q, "prefixItems") && !has(p, "prefixItems") {
                    self.inexact(
                        "allOf",
                        path,
                        Kind::Neither,
                        "items and prefixItems in different members",
                    );
                }
                let closed = p
                    .get("additionalProperties")
                    .is_some_and(|a| *a != Value::Bool(true));
                let names = |m: &Map<String, Value>| {
                    m.get("properties")
                        .and_then(Value::as_object)
                        .map(|o| o.keys().cloned().collect::<Vec<_>>())
                        .unwrap_or_default()
                };
                let own = names(p);
                if closed && names(q).iter().any(|n| !own.contains(n)) {
                    self.inexact(
                        "allOf",
                        path,
                        Kind::Superset,
                        "additionalProperties beside properties of another member",
                    );
                }
            }
        }
        let mut out = Map::new();
        for p in parts {
            for (k, v) in p {
                match (k.as_str(), out.get_mut(&k)) {
                    (_, None) => {
                        out.insert(k, v);
                    }
                    ("properties", Some(Value::Object(props))) => {
                        for (name, s) in v.as_object().cloned().unwrap_or_default() {
                            // A property constrained twice must satisfy both schemas (kept
                            // in place: declared order is the output order).
                            match props.get_mut(&name) {
                                Some(prev) if *prev != s => {
                                    let mut both = Map::new();
                                    both.insert(
                                        "allOf".into(),
                                        Value::Array(vec![prev.clone(), s]),
                                    );
                                    *prev = Value::Object(both);
                                }
                                Some(_) => {}
                                None => {
                                    props.insert(name, s);
                                }
                            }
                        }
                    }
                    ("type", Some(prev)) => {
                        // Both types hold: the kinds in both lists (integer within number).
                        let kinds = |t: &Value| -> Vec<String> {
                            match t {
                                Value::String(k) => vec![k.clone()],
                                Value::Array(ks) => ks
                                    .iter()
                                    .filter_map(|k| k.as_str().map(str::to_owned))
                                    .collect(),
                                _ => Vec::new(),
                            }
                        };
                        let (a, b) = (kinds(prev), kinds(&v));
                        let has = |ks: &[String], k: &str| {
                            ks.iter()
                                .any(|x| x == k || (k == "integer" && x == "number"))
                        };
                        let both: Vec<Value> = [
                            "object", "array", "string", "number", "integer", "boolean", "null",
                        ]
                        .iter()
                        .filter(|k| {
                            has(&a, k)
                                && has(&b, k)
                                && !(**k == "number"
                                    && (!a.iter().any(|x| x == "number")
                                        || !b.iter().any(|x| x == "number")))
                        })
                        .map(|k| Value::String((*k).to_owned()))
                        .collect();
                        if both.is_empty() {
                            // No kind satisfies both: nothing is valid.
                            return Ok(Value::Bool(false));
                        } else {
                            *prev = Value::Array(both);
                        }
                    }
                    ("required", Some(Value::Array(req))) => {
                        for r in v.as_array().cloned().unwrap_or_default() {
                            if !req.contains(&r) {
                                req.push(r);
                            }
                        }
                    }
                    ("additionalProperties", Some(prev)) => {
                        if v == Value::Bool(false) {
                            *prev = v;
                        } else if *prev != Value::Bool(false) && *prev != v {
                            self.inexact(
                                "allOf",
                                path,
                                Kind::Superset,
                                "two additionalProperties schemas (one kept)",
                            );
                        }
                    }
                    // Both bounds hold: the tighter one.
                    (
                        "minimum" | "exclusiveMinimum" | "minLength" | "minItems" | "minProperties",
                        Some(prev),
                    ) if prev.is_number() && v.is_number() => {
                        if v.as_f64() > prev.as_f64() {
                            *prev = v;
                        }
                    }
                    (
                        "maximum" | "exclusiveMaximum" | "maxLength" | "maxItems" | "maxProperties",
                        Some(prev),
                    ) if prev.is_number() && v.is_number() => {
                        if v.as_f64() < prev.as_f64() {
                            *prev = v;
                        }
                    }
                    // Multiples of two integers: multiples of their least common multiple.
                    ("multipleOf", Some(prev))
                        if prev.as_u64().is_some() && v.as_u64().is_some() =>
                    {
                        let (a, b) = (prev.as_u64().unwrap_or(1), v.as_u64().unwrap_or(1));
                        let (mut x, mut y) = (a, b);
                        while y != 0 {
                            (x, y) = (y, x % y);
                        }
                        match (a / x.max(1)).checked_mul(b) {
                            Some(l) => *prev = Value::from(l),
                            None => self.inexact(
                                "allOf",
                                path,
                                Kind::Superset,
                                "two multipleOf whose product overflows (one kept)",
                            ),
                        }
                    }
                    // Both lists hold: the values in both (numbers compared by value).
                    ("enum", Some(Value::Array(prev))) if v.is_array() => {
                        let other = v.as_array().cloned().unwrap_or_default();
                        let same = |u: &Value, w: &Value| match (u.as_f64(), w.as_f64()) {
                            (Some(p), Some(q)) => p == q,
                            _ => u == w,
                        };
                        prev.retain(|x| other.iter().any(|y| same(x, y)));
                    }
                    // Both hold: one alternative of each (a bounded product).
                    ("anyOf", Some(Value::Array(prev))) if v.is_array() => {
                        let other = v.as_array().cloned().unwrap_or_default();
                        if prev.len() * other.len() > MAX_PRODUCT {
                            let detail = format!(
                                "two anyOf with {} x {} alternatives: at most {MAX_PRODUCT} \
                                 combined (one kept)",
                                prev.len(),
                                other.len()
                            );
                            self.inexact("allOf", path, Kind::Superset, &detail);
                            continue;
                        }
                        let mut product = Vec::new();
                        for a in prev.iter() {
                            for b in &other {
                                let mut m = Map::new();
                                m.insert("allOf".into(), Value::Array(vec![a.clone(), b.clone()]));
                                product.push(Value::Object(m));
                            }
                        }
                        *prev = product;
                    }
                    (_, Some(prev)) if *prev == v || ignored(&k) => {}
                    (key, Some(_)) => {
                        let detail = format!("two {key:?} that are not merged (one kept)");
                        self.inexact("allOf", path, Kind::Superset, &detail);
                    }
                }
            }
        }
        Ok(Value::Object(out))
    }

    /// A JSON value equal to `v`, laid out with the configured separators.
    fn literal(&mut self, v: &Value) -> Result<Sym, GrammarError> {
        if self.opts.property_order == PropertyOrder::Any && has_object_pair(v) {
            // Members of an object compare in any order: a schema of exactly this value.
            let s = literal_schema(v);
            return self.schema(&s, "#", 0);
        }
        let regex = self.literal_regex(v);
        self.b.lexeme(&regex)
    }

    fn literal_regex(&self, v: &Value) -> String {
        let ws = self.ws_regex();
        let (item, key) = if self.opts.whitespace {
            (
                self.opts.item_separator.trim(),
                self.opts.key_separator.trim(),
            )
        } else {
            (
                self.opts.item_separator.as_str(),
                self.opts.key_separator.as_str(),
            )
        };
        let sep = |s: &str| format!("{ws}{}{ws}", regex_escape(s));
        match v {
            Value::Array(xs) => {
                let inner: Vec<String> = xs.iter().map(|x| self.literal_regex(x)).collect();
                format!("\\[{ws}{}{ws}\\]", inner.join(&sep(item)))
            }
            Value::Object(o) => {
                let inner: Vec<String> = o
                    .iter()
                    .map(|(k, x)| {
                        let key_json = Value::String(k.clone()).to_string();
                        format!(
                            "{}{}{}",
                            regex_escape(&key_json),
                            sep(key),
                            self.literal_regex(x)
                        )
                    })
                    .collect();
                format!("\\{{{ws}{}{ws}\\}}", inner.join(&sep(item)))
            }
            // Numbers compare by value: an integral one may be written with a zero fraction
            // (up to 2^53, where every reader's value is exact), zero also as `-0`, and a
            // fraction with trailing zeros.
            Value::Number(n) => {
                let text = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => i.to_string(),
                    (_, Some(u), _) => u.to_string(),
                    (_, _, Some(x)) if x.fract() == 0.0 && x.abs() <= 2f64.powi(53) => {
                        format!("{}", x as i64)
                    }
                    _ => v.to_string(),
                };
                let small = n.as_f64().is_some_and(|x| x.abs() <= 2f64.powi(53));
                let sign = if text == "0" { "-?" } else { "" };
                if text.contains(['e', 'E']) {
                    regex_escape(&text)
                } else if text.contains('.') {
                    format!("{sign}{}0*", regex_escape(&text))
                } else if small {
                    format!("{sign}{}(?:\\.0+)?", regex_escape(&text))
                } else {
                    regex_escape(&text)
                }
            }
            _ => regex_escape(&v.to_string()),
        }
    }

    fn string(&mut self, obj: &Map<String, Value>, path: &str) -> Result<Sym, GrammarError> {
        let min = self.count(obj, "minLength", path)?.unwrap_or(0);
        let max = self.count(obj, "maxLength", path)?;
        let fmt =
            (obj.get("format").and_then(Value::as_str)).filter(|_| self.opts.format_assertion);
        let pattern = obj.get("pattern").and_then(Value::as_str);
        if pattern.is_some() {
            let detail = "string values under pattern are written with \\u escapes only \
                          for control characters";
            self.inexact("pattern", path, Kind::Spelling, detail);
        }
        // A format the spec defines but this compiler lacks is refused; others are
        // annotations no validator checks.
        let fmt = match fmt {
            Some(f) if !formats::FORMATS.contains(&f) => {
                if SPEC_FORMATS.contains(&f) {
                    let detail = format!("format {f:?} not compiled: not checked");
                    self.inexact("format", path, Kind::Superset, &detail);
                }
                None
            }
            f => f,
        };
        let len = match max {
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        };
        let has_len = min > 0 || max.is_some();
        if let (None, None, true) = (pattern, fmt, has_len) {
            return self.counted_string(min, max);
        }
        if pattern.is_none() && fmt.is_none() {
            // (The plain string is spelled as everywhere else: one lexeme for all of them.)
            return self.b.lexeme(STRING);
        }
        if fmt.is_some() {
            let detail = "string values under format are written with \\u escapes only for \
                          control characters";
            self.inexact("format", path, Kind::Spelling, detail);
        }
        // The pattern (unanchored, as JSON Schema reads it), the length and the format
        // intersected, over the string's characters, then read through JSON's escapes.
        let limits = self.b.limits().lexeme;
        let plain = format!(r#"(?s:.){len}"#);
        let key = format!("pattern {pattern:?} length {len} format {fmt:?}");
        let content = self.b.lexeme_dfa(&key, || {
            let mut dfa = TableDfa::compile(&plain, limits)?;
            if let Some(p) = pattern {
                let p = ecma_classes(p);
                let p = TableDfa::compile(&format!("(?s:.)*(?:{p})(?s:.)*"), limits)?;
                dfa = dfa.intersect(&p, limits)?;
            }
            if let Some(f) = fmt.and_then(|f| formats::format_dfa(f, limits)) {
                dfa = dfa.intersect(&f?, limits)?;
            }
            Ok(json_escaped(&dfa, false))
        })?;
        let quote = self.b.lexeme("\"")?;
        let nt = self.b.fresh("string");
        self.b.rule(nt, vec![quote, content, quote])?;
        Ok(Sym::Nt(nt))
    }

    /// A string of `min..=max` characters: the count lives in the lexeme's state (a DFA
    /// counting to `maxLength: 32767` would be 32767 times the size of one character's).
    fn counted_string(&mut self, min: u64, max: Option<u64>) -> Result<Sym, GrammarError> {
        if let Some(max) = max.filter(|&m| m < min) {
            return Err(GrammarError::Grammar(format!(
                "minLength {min} exceeds maxLength {max}"
            )));
        }
        let too_large = |n: u64| {
            u32::try_from(n).map_err(|_| {
                GrammarError::TooLarge(format!("a string length bound of {n} is too large"))
            })
        };
        self.b.counted_lexeme(
            STRING_CHAR,
            too_large(min)?,
            max.map(too_large).transpose()?,
        )
    }

    /// An integer within `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`.
    fn integer(&mut self, obj: &Map<String, Value>, path: &str) -> Result<Sym, GrammarError> {
        let mut lo: Option<f64> = None;
        let mut hi: Option<f64> = None;
        for (key, is_lo, exclusive) in [
            ("minimum", true, false),
            ("exclusiveMinimum", true, true),
            ("maximum", false, false),
            ("exclusiveMaximum", false, true),
        ] {
            let Some(v) = obj.get(key) else { continue };
            let Some(x) = v.as_f64() else {
                return Err(GrammarError::Grammar(format!(
                    "{path}: {key} must be a number"
                )));
            };
            // The nearest integer inside the bound.
            let b = match (is_lo, exclusive) {
                (true, false) => x.ceil(),
                (true, true) => x.floor() + 1.0,
                (false, false) => x.floor(),
                (false, true) => x.ceil() - 1.0,
            };
            if is_lo {
                lo = Some(lo.map_or(b, |l| l.max(b)));
            } else {
                hi = Some(hi.map_or(b, |h| h.min(b)));
            }
        }
        let multiple = self.multiple_of(obj, path)?;
        // Bounds past i64 (about 9.2e18) are not supported: f64 cannot say which integers
        // they exclude anyway.
        let to_i64 = |x: Option<f64>| -> Result<Option<i64>, GrammarError> {
            match x {
                Some(x) if x.abs() >= 9.2e18 => Err(GrammarError::Unsupported(format!(
                    "an integer bound of {x} (at {path}): beyond +-9.2e18"
                ))),
                Some(x) => Ok(Some(x as i64)),
                None => Ok(None),
            }
        };
        let (lo, hi) = (to_i64(lo)?, to_i64(hi)?);
        if let (Some(l), Some(h)) = (lo, hi) {
            if l > h {
                return Err(GrammarError::Grammar(format!(
                    "{path}: no integer lies in [{l}, {h}]"
                )));
            }
        }
        let mut range = int_range_regex(lo, hi);
        if lo.is_none_or(|l| l <= 0) && hi.is_none_or(|h| h >= 0) {
            range = format!("(?:{range}|-0)");
        }
        if self.legacy_integer {
            // Drafts 3 and 4: an integer is a number written without a fraction or an
            // exponent (1.0 is not one), so the canonical texts are exact.
            let Some((a, d)) = multiple else {
                return self.b.lexeme(&range);
            };
            let limits = self.b.limits().lexeme;
            return self
                .b
                .lexeme_dfa(&format!("integer {range} multiple of {a}/10^{d}"), || {
                    TableDfa::compile(&range, limits)?
                        .intersect(&multiple_of_dfa(a, d, false), limits)
                });
        }
        // Any number whose value is an integer is one: a zero fraction (`1.0`), and with an
        // exponent the texts `exponent_regex` gives, whose value it can tell.
        let plain = format!("{range}(?:\\.0+)?");
        let exponent = match multiple {
            _ if lo.is_some() || hi.is_some() => None,
            None => Some((1, 0)),
            Some((a, d)) => {
                // a = 2^x 5^y a' (a' prime to 10): m * 10^k is a multiple of a / 10^d for
                // every k >= max(x, y) - d exactly when m is a multiple of a'.
                let (mut rest, mut x, mut y) = (a, 0u32, 0u32);
                while rest % 2 == 0 {
                    rest /= 2;
                    x += 1;
                }
                while rest % 5 == 0 {
                    rest /= 5;
                    y += 1;
                }
                let shift = x.max(y).saturating_sub(d);
                let states = (MAX_EXPONENT_FRACTION as u64 + 4).saturating_mul(rest);
                (states <= multiple_of::MAX_STATES as u64).then_some((rest, shift))
            }
        };
        let detail = match exponent {
            Some(_) => format!(
                "integers with an exponent are written as floats print them: one integer \
                 digit, at most {MAX_EXPONENT_FRACTION} fraction digits, an exponent of at \
                 least their count, below 1.7e308 (1.5e1, not 15e0 or 15e-1)"
            ),
            None => "integers under bounds (or a large multipleOf) are written without an \
                     exponent (100 or 100.0, not 1e2)"
                .to_owned(),
        };
        self.inexact("type", path, Kind::Spelling, &detail);
        let limits = self.b.limits().lexeme;
        let Some((a, d)) = multiple else {
            return match exponent {
                Some((_, shift)) => self
                    .b
                    .lexeme(&format!("(?:{plain}|{})", exponent_regex(shift))),
                None => self.b.lexeme(&plain),
            };
        };
        let plain_sym = self
            .b
            .lexeme_dfa(&format!("integer {plain} multiple of {a}/10^{d}"), || {
                TableDfa::compile(&plain, limits)?.intersect(&multiple_of_dfa(a, d, true), limits)
            })?;
        let Some((rest, shift)) = exponent else {
            return Ok(plain_sym);
        };
        let regex = exponent_regex(shift);
        let exp_sym = self.b.lexeme_dfa(
            &format!("integer {regex} mantissa multiple of {rest}"),
            || {
                let dfa = TableDfa::compile(&regex, limits)?;
                match rest {
                    1 => Ok(dfa),
                    _ => dfa.intersect(&multiple_of::mantissa_multiple_dfa(rest), limits),
                }
            },
        )?;
        self.alt("integer", vec![vec![plain_sym], vec![exp_sym]])
    }

    /// `multipleOf` as `(a, d)`, the multiples of `a / 10^d` (`None` without one; refused,
    /// with a placeholder, when its automaton would be too large).
    fn multiple_of(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
    ) -> Result<Option<(u64, u32)>, GrammarError> {
        let Some(v) = obj.get("multipleOf") else {
            return Ok(None);
        };
        let Some(x) = v.as_f64().filter(|x| x.is_finite() && *x > 0.0) else {
            return Err(GrammarError::Grammar(format!(
                "{path}: multipleOf must be a number above 0"
            )));
        };
        // The decimal as written: a / 10^d with a an integer (exact for JSON's literals).
        let parsed = Decimal::parse(v, x).and_then(|dec| {
            let d = u32::try_from(dec.frac.len()).ok()?;
            let mut a = u64::try_from(dec.int).ok()?;
            for &c in &dec.frac {
                a = a.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            }
            Some((a, d))
        });
        match parsed {
            Some((a, d)) if multiple_of::states_needed(a, d) <= multiple_of::MAX_STATES => {
                Ok(Some((a, d)))
            }
            _ => {
                // Divisibility needs one state per remainder: a large divisor (or a long
                // fraction) would need too many.
                let detail = format!(
                    "multipleOf {v}: its automaton needs more than {} states (not checked)",
                    multiple_of::MAX_STATES
                );
                self.inexact("multipleOf", path, Kind::Superset, &detail);
                Ok(Some((1, 0)))
            }
        }
    }

    /// A number within `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`: bounded
    /// numbers are written without an exponent and never as `-0` (a subset of their texts),
    /// so each bound is a digit-wise comparison; two bounds are intersected as DFAs.
    fn number(&mut self, obj: &Map<String, Value>, path: &str) -> Result<Sym, GrammarError> {
        let mut parts = Vec::new();
        for (key, is_lo, strict) in [
            ("minimum", true, false),
            ("exclusiveMinimum", true, true),
            ("maximum", false, false),
            ("exclusiveMaximum", false, true),
        ] {
            let Some(v) = obj.get(key) else { continue };
            let Some(x) = v.as_f64().filter(|x| x.is_finite()) else {
                return Err(GrammarError::Grammar(format!(
                    "{path}: {key} must be a number"
                )));
            };
            let bound = Decimal::parse(v, x).ok_or_else(|| {
                GrammarError::Unsupported(format!("{key} {v} (at {path}): beyond +-9.2e18"))
            })?;
            parts.push(bound.regex(is_lo, strict));
        }
        let multiple = self.multiple_of(obj, path)?;
        if parts.is_empty() && multiple.is_none() {
            return self.b.lexeme(NUMBER);
        }
        let detail = "numbers under bounds or multipleOf are written without exponents";
        self.inexact("minimum", path, Kind::Spelling, detail);
        if parts.is_empty() {
            parts.push(NUMBER.to_owned());
        }
        let limits = self.b.limits().lexeme;
        let mut key = format!("number {}", parts.join(" & "));
        if let Some((a, d)) = multiple {
            // Multiples are written without an exponent (a subset of their texts, as for
            // bounded numbers).
            key.push_str(&format!(" multiple of {a}/10^{d}"));
        }
        self.b.lexeme_dfa(&key, || {
            let mut dfa = TableDfa::compile(&parts[0], limits)?;
            for p in &parts[1..] {
                dfa = dfa.intersect(&TableDfa::compile(p, limits)?, limits)?;
            }
            if let Some((a, d)) = multiple {
                dfa = dfa.intersect(&multiple_of_dfa(a, d, true), limits)?;
            }
            Ok(dfa)
        })
    }

    fn count(
        &mut self,
        obj: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<u64>, GrammarError> {
        match obj.get(key) {
            None => Ok(None),
            // An integral float (`2.0`) counts as its integer, as the spec allows.
            Some(v) => v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|x| x.fract() == 0.0 && (0.0..9e15).contains(x))
                        .map(|x| x as u64)
                })
                .map(Some)
                .ok_or_else(|| {
                    GrammarError::Grammar(format!("{path}: {key} must be a non-negative integer"))
                }),
        }
    }

    /// `propertyNames` as a filter on names (`None`: no constraint). Only keywords about
    /// strings can reject a name (every name is a string); applicators are refused.
    fn property_names(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
    ) -> Result<Option<NameFilter>, GrammarError> {
        let never = || NameFilter {
            desc: vec!["nothing".to_owned()],
            raw: Vec::new(),
            listed: Some(Vec::new()),
        };
        let o = match obj.get("propertyNames") {
            None | Some(Value::Bool(true)) => return Ok(None),
            Some(Value::Bool(false)) => return Ok(Some(never())),
            Some(Value::Object(o)) => o,
            Some(_) => {
                return Err(GrammarError::Grammar(format!(
                    "{path}: propertyNames must be a schema"
                )))
            }
        };
        let at = format!("{path}/propertyNames");
        let applicators = o.keys().filter(|k| {
            !["type", "const", "enum"].contains(&k.as_str())
                && (GENERAL_KEYS.contains(&k.as_str())
                    || ["if", "then", "else", "$dynamicRef", "$recursiveRef"].contains(&k.as_str()))
        });
        let refused: Vec<String> = applicators.cloned().collect();
        if !refused.is_empty() {
            for k in refused {
                self.inexact(&k, &at, Kind::Superset, "not compiled in propertyNames");
            }
            return Ok(None);
        }
        if let Some(t) = o.get("type") {
            let string = match t {
                Value::String(t) => t == "string",
                Value::Array(ts) => ts.iter().any(|t| t == "string"),
                _ => true,
            };
            if !string {
                return Ok(Some(never()));
            }
        }
        let limits = self.b.limits().lexeme;
        let mut f = NameFilter {
            desc: Vec::new(),
            raw: Vec::new(),
            listed: None,
        };
        if let Some(p) = o.get("pattern").and_then(Value::as_str) {
            f.desc.push(format!("pattern {p:?}"));
            let raw = format!("(?s:.)*(?:{})(?s:.)*", ecma_classes(p));
            f.raw.push(TableDfa::compile(&raw, limits)?);
        }
        let min = self.count(o, "minLength", &at)?.unwrap_or(0);
        let max = self.count(o, "maxLength", &at)?;
        if min > 0 || max.is_some() {
            let len = match max {
                Some(max) => format!("{{{min},{max}}}"),
                None => format!("{{{min},}}"),
            };
            f.desc.push(format!("length {len}"));
            f.raw
                .push(TableDfa::compile(&format!("(?s:.){len}"), limits)?);
        }
        let fmt = o.get("format").and_then(Value::as_str);
        if let Some(fmt) = fmt.filter(|_| self.opts.format_assertion) {
            match formats::format_dfa(fmt, limits) {
                Some(r) => {
                    f.desc.push(format!("format {fmt:?}"));
                    f.raw.push(r?);
                }
                None if SPEC_FORMATS.contains(&fmt) => {
                    let detail = format!("format {fmt:?} not compiled: not checked");
                    self.inexact("format", &at, Kind::Superset, &detail);
                }
                None => {}
            }
        }
        let listed: Option<Vec<&Value>> = match (o.get("const"), o.get("enum")) {
            (Some(c), _) => Some(vec![c]),
            (None, Some(Value::Array(e))) => Some(e.iter().collect()),
            (None, Some(_)) => {
                return Err(GrammarError::Grammar(format!(
                    "{at}: enum must be an array"
                )))
            }
            (None, None) => None,
        };
        if let Some(listed) = listed {
            // Names listed and passing the other keywords, as their exact JSON texts.
            let names: Vec<String> = listed
                .into_iter()
                .filter_map(Value::as_str)
                .filter(|n| f.allows(n))
                .map(str::to_owned)
                .collect();
            f.desc = vec![format!("names {names:?}")];
            f.listed = Some(names);
        }
        Ok(Some(f))
    }

    fn object(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Sym, GrammarError> {
        let empty = Map::new();
        let mut props = match obj.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => {
                return Err(GrammarError::Grammar(format!(
                    "{path}: properties must be an object"
                )))
            }
        };
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // A required name that a pattern of patternProperties matches is declared (its
        // schemas are the patterns', merged below).
        let with_matched;
        let pattern_names: Vec<&String> = (obj.get("patternProperties"))
            .and_then(Value::as_object)
            .map(|p| p.keys().collect())
            .unwrap_or_default();
        let mut matched = props.clone();
        for p in pattern_names {
            let raw = format!("(?s:.)*(?:{})(?s:.)*", ecma_classes(p));
            let dfa = TableDfa::compile(&raw, self.b.limits().lexeme)?;
            for r in &required {
                if !matched.contains_key(*r) && dfa.is_accepting(dfa.run(dfa.start(), r.as_bytes()))
                {
                    matched.insert((*r).to_owned(), Value::Bool(true));
                }
            }
        }
        if matched.len() > props.len() {
            with_matched = matched;
            props = &with_matched;
        }
        // A required property without a schema of its own: any value (unless
        // additionalProperties forbids it: then no object is valid). A few of them, with no
        // patternProperties, are generated among the additional properties in any order (the
        // ones still missing tracked as a set); otherwise after the declared ones, in
        // `required` order.
        let mut with_required;
        let forbids_more = obj.get("additionalProperties") == Some(&Value::Bool(false))
            || (self.opts.closed && !obj.contains_key("additionalProperties"));
        let mut undeclared: Vec<&str> = Vec::new();
        for r in &required {
            if !props.contains_key(*r) && !undeclared.contains(r) {
                undeclared.push(r);
            }
        }
        let any_order = !undeclared.is_empty()
            && undeclared.len() <= MAX_ANY_ORDER
            && !forbids_more
            && !obj.contains_key("patternProperties");
        let extras: Vec<&str> = if any_order { undeclared } else { Vec::new() };
        if !any_order && required.iter().any(|r| !props.contains_key(*r)) {
            with_required = props.clone();
            for r in &required {
                if !with_required.contains_key(*r) {
                    let s = match forbids_more {
                        true => Value::Bool(false),
                        false => obj
                            .get("additionalProperties")
                            .cloned()
                            .unwrap_or(Value::Bool(true)),
                    };
                    with_required.insert((*r).to_owned(), s);
                }
            }
            props = &with_required;
        }
        // propertyNames: a declared name it rejects can never appear (a required one makes
        // every object invalid); generated keys are intersected with it below.
        let names = self.property_names(obj, path)?;
        let with_names;
        if let Some(f) = &names {
            if required.iter().any(|r| !f.allows(r)) {
                return self.b.lexeme(NOTHING);
            }
            if props.keys().any(|k| !f.allows(k)) {
                with_names = props
                    .iter()
                    .filter(|(k, _)| f.allows(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<String, Value>>();
                props = &with_names;
            }
        }
        let name_regexes: Vec<String> = names.as_ref().map(|f| f.desc.clone()).unwrap_or_default();
        let additional = match obj.get("additionalProperties") {
            None if self.opts.closed => None,
            None | Some(Value::Bool(true)) => Some(Value::Bool(true)),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(s.clone()),
        };
        let open = self.punct("{")?;
        let close = self.punct("}")?;
        let sep = self.item_sep()?;
        let key_sep = self.opts.key_separator.clone();
        let key_sep = self.punct(&key_sep)?;
        let patterns: Vec<(String, Value)> = match obj.get("patternProperties") {
            None => Vec::new(),
            Some(Value::Object(p)) => p.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Some(_) => {
                return Err(GrammarError::Grammar(format!(
                    "{path}: patternProperties must be an object"
                )))
            }
        };
        // Tails after the declared properties: more properties, each key in one class with
        // its value schema. Keys are never the declared names (JSON keys are unique). With
        // patternProperties, a key matching pattern i (and no other) takes schema i, a key
        // matching none takes additionalProperties; keys matching two patterns, or written
        // with escapes, are not generated (a subset of the valid objects).
        let declared: Vec<String> = props
            .keys()
            .map(String::as_str)
            .chain(extras.iter().copied())
            .map(|k| regex_escape(&Value::String(k.to_owned()).to_string()))
            .collect();
        let limits = self.b.limits().lexeme;
        // Keys are built over names (decoded characters), then read through JSON's escapes.
        let raw_pattern = |p: &str| format!("(?s:.)*(?:{})(?s:.)*", ecma_classes(p));
        let declared_names: Vec<String> = props
            .keys()
            .map(String::as_str)
            .chain(extras.iter().copied())
            .map(regex_escape)
            .collect();
        let declared_raw = declared_names.join("|");
        let key_dfa = |inside: &[String], outside: &[String]| -> Result<TableDfa, GrammarError> {
            let mut d = any_text(limits)?;
            for r in inside {
                d = d.intersect(&TableDfa::compile(r, limits)?, limits)?;
            }
            if let Some(f) = &names {
                for r in &f.raw {
                    d = d.intersect(r, limits)?;
                }
                if let Some(l) = &f.listed {
                    let listed = match l.is_empty() {
                        true => NOTHING.to_owned(),
                        false => alts(l.iter().map(|n| regex_escape(n)).collect()),
                    };
                    d = d.intersect(&TableDfa::compile(&listed, limits)?, limits)?;
                }
            }
            for o in outside
                .iter()
                .chain([&declared_raw])
                .filter(|o| !o.is_empty())
            {
                d = d.difference(&TableDfa::compile(o, limits)?, limits)?;
            }
            Ok(json_escaped(&d, true))
        };
        // A declared property matching patterns satisfies their schemas beside its own.
        let with_patterns;
        let mut merged = props.clone();
        for (p, ps) in &patterns {
            let dfa = TableDfa::compile(&raw_pattern(p), limits)?;
            for (name, s) in merged.iter_mut() {
                if dfa.is_accepting(dfa.run(dfa.start(), name.as_bytes())) {
                    let mut both = Map::new();
                    both.insert("allOf".into(), Value::Array(vec![s.clone(), ps.clone()]));
                    *s = Value::Object(both);
                }
            }
        }
        if merged != *props {
            with_patterns = merged;
            props = &with_patterns;
        }
        // Keys matching exactly the patterns of a subset S take all of S's schemas: one class
        // per non-empty subset (keys outside every pattern take additionalProperties).
        if patterns.len() > MAX_PATTERNS {
            let detail = format!(
                "{} patterns (at most {MAX_PATTERNS} combined): keys matching two are not \
                 generated",
                patterns.len()
            );
            self.inexact("patternProperties", path, Kind::Subset, &detail);
        }
        let subsets: Vec<Vec<usize>> = if patterns.len() > MAX_PATTERNS {
            (0..patterns.len()).map(|i| vec![i]).collect()
        } else {
            (1..1usize << patterns.len())
                .map(|m| (0..patterns.len()).filter(|i| m & (1 << i) != 0).collect())
                .collect()
        };
        let mut classes: Vec<(Sym, Sym)> = Vec::new();
        for subset in subsets {
            let inside: Vec<String> = subset
                .iter()
                .map(|&i| raw_pattern(&patterns[i].0))
                .collect();
            let others: Vec<String> = (0..patterns.len())
                .filter(|j| !subset.contains(j))
                .map(|j| raw_pattern(&patterns[j].0))
                .collect();
            let key_desc =
                format!("key {inside:?} but {declared:?} {others:?} in {name_regexes:?}");
            let key = self.b.lexeme_dfa(&key_desc, || key_dfa(&inside, &others))?;
            let schemas: Vec<Value> = subset.iter().map(|&i| patterns[i].1.clone()).collect();
            let first = &patterns[subset[0]].0;
            let at = format!("{path}/patternProperties/{first}");
            let value = if schemas.len() == 1 {
                self.schema(&schemas[0], &at, depth + 1)?
            } else {
                let mut all = Map::new();
                all.insert("allOf".into(), Value::Array(schemas));
                self.schema(&Value::Object(all), &at, depth + 1)?
            };
            classes.push((key, value));
        }
        if !patterns.is_empty() || !name_regexes.is_empty() || !declared.is_empty() {
            let detail = "object keys are written with \\u escapes only for control characters";
            self.inexact("properties", path, Kind::Spelling, detail);
        }
        if let Some(schema) = &additional {
            let key = if declared.is_empty() && patterns.is_empty() && name_regexes.is_empty() {
                self.b.lexeme(STRING)?
            } else {
                let excluded: Vec<String> = patterns.iter().map(|(q, _)| raw_pattern(q)).collect();
                let desc = format!("key but {excluded:?} {declared:?} in {name_regexes:?}");
                self.b.lexeme_dfa(&desc, || key_dfa(&[], &excluded))?
            };
            let value = self.schema(schema, &format!("{path}/additionalProperties"), depth + 1)?;
            classes.push((key, value));
        }
        let min_props = self.count(obj, "minProperties", path)?.unwrap_or(0);
        let max_props = self.count(obj, "maxProperties", path)?;
        let once = props.len() + extras.len();
        let counts_fit = [Some(min_props), max_props]
            .iter()
            .flatten()
            .all(|&c| c <= u64::from(MAX_SET_COUNT));
        if self.opts.property_order == PropertyOrder::Any && once <= MAX_SET_MEMBERS && counts_fit {
            // Any order, each declared property at most once, every required one present:
            // a member set (the parser tracks the members used, the grammar stays linear).
            let mut members: Vec<(Sym, bool, bool)> = Vec::new();
            let mut required_count = 0u64;
            let named: Vec<(String, Value, bool)> = props
                .iter()
                .map(|(k, v)| (k.clone(), v.clone(), required.contains(&k.as_str())))
                .chain(extras.iter().map(|n| {
                    let s = additional.clone().unwrap_or(Value::Bool(true));
                    ((*n).to_owned(), s, true)
                }))
                .collect();
            for (name, s, req) in &named {
                if *req && *s == Value::Bool(false) {
                    return self.b.lexeme(NOTHING); // a required property that cannot be
                }
                required_count += u64::from(*req);
                let key_json = Value::String(name.clone()).to_string();
                let key = self.b.lexeme(&regex_escape(&key_json))?;
                let value = self.schema(s, &format!("{path}/properties/{name}"), depth + 1)?;
                let m = self.b.fresh("member");
                self.b.rule(m, vec![key, key_sep, value])?;
                members.push((Sym::Nt(m), *req, true));
            }
            for &(key, value) in &classes {
                let m = self.b.fresh("member");
                self.b.rule(m, vec![key, key_sep, value])?;
                members.push((Sym::Nt(m), false, false));
            }
            let impossible = max_props.is_some_and(|m| m < required_count.max(min_props))
                || (classes.is_empty() && (named.len() as u64) < min_props);
            if impossible {
                return self.b.lexeme(NOTHING);
            }
            let set = self.b.fresh("members");
            let max = max_props.map(|m| m as u32);
            self.b
                .member_set(set, &members, sep, min_props as u32, max)?;
            let nt = self.b.fresh("object");
            self.b.rule(nt, vec![open, Sym::Nt(set), close])?;
            return Ok(Sym::Nt(nt));
        }
        if !counts_fit {
            let top = max_props.unwrap_or(min_props);
            let key = ["minProperties", "maxProperties"][usize::from(max_props.is_some())];
            let detail = format!("counting to {top}: at most {MAX_SET_COUNT} (no object)");
            self.inexact(key, path, Kind::Subset, &detail);
            return self.b.lexeme(NOTHING);
        }
        if self.opts.property_order == PropertyOrder::Any {
            let detail = format!(
                "{once} properties (more than {MAX_SET_MEMBERS} tracked in any order): declared \
                 order only"
            );
            self.inexact("properties", path, Kind::Subset, &detail);
        }
        // Properties are counted (0..=top emitted so far) where min/maxProperties ask:
        // up to maxProperties, or else up to max(minProperties, 1), saturating (past it only
        // "something was emitted" matters, for the separator). Without either keyword this
        // is the plain "first / rest" chain.
        let top = max_props.unwrap_or(min_props.max(1));
        let width = (top as usize + 1)
            .saturating_mul(props.len() + 1)
            .saturating_mul(1 << extras.len());
        if top > MAX_COUNT || width > MAX_COUNT_RULES {
            let detail = format!(
                "counting to {top} over {} properties in declared order: more than \
                 {MAX_COUNT} counts or {MAX_COUNT_RULES} rules (no object)",
                props.len()
            );
            self.inexact("maxProperties", path, Kind::Subset, &detail);
            return self.b.lexeme(NOTHING);
        }
        let top = top as usize;
        let can_add = |c: usize| max_props.is_none_or(|m| (c as u64) < m);
        let inc = |c: usize| match max_props {
            None => (c + 1).min(top),
            Some(_) => c + 1,
        };
        let nothing = self.b.lexeme(NOTHING)?;
        // The undeclared required properties: key, value.
        let mut extra = Vec::new();
        for name in &extras {
            let key_json = Value::String((*name).to_owned()).to_string();
            let key = self.b.lexeme(&regex_escape(&key_json))?;
            let s = additional.clone().unwrap_or(Value::Bool(true));
            let value = self.schema(&s, &format!("{path}/required/{name}"), depth + 1)?;
            extra.push((key, value));
        }
        let full = (1usize << extra.len()) - 1;
        // tails[s][c]: the additional properties after c were emitted, s the set of
        // undeclared required ones among them.
        let tails: Vec<Vec<u32>> = (0..=full)
            .map(|_| (0..=top).map(|_| self.b.fresh("more")).collect())
            .collect();
        let mut rest = None;
        if max_props.is_none() && !classes.is_empty() {
            // rest ::= rest sep key_c : value_c (each class c) | ε
            let r = self.b.fresh("more");
            for &(key, value) in &classes {
                self.b.rule(r, vec![Sym::Nt(r), sep, key, key_sep, value])?;
            }
            self.b.rule(r, vec![])?;
            rest = Some(r);
        }
        for (set, tail) in tails.iter().enumerate() {
            let missing: Vec<usize> = (0..extra.len()).filter(|i| set & (1 << i) == 0).collect();
            for (c, &t) in tail.iter().enumerate() {
                // Every state gets a rule (one that derives nothing is pruned at build).
                self.b.rule(t, vec![nothing])?;
                if max_props.is_none() && c == top {
                    // Saturated: any more additional properties, each missing required one
                    // somewhere among them.
                    let r = rest.map(|r| vec![Sym::Nt(r)]).unwrap_or_default();
                    if missing.is_empty() {
                        self.b.rule(t, r.clone())?;
                    }
                    for &i in &missing {
                        let (key, value) = extra[i];
                        let mut rhs = r.clone();
                        rhs.extend([sep, key, key_sep, value, Sym::Nt(tails[set | 1 << i][c])]);
                        self.b.rule(t, rhs)?;
                    }
                    continue;
                }
                if c as u64 >= min_props && missing.is_empty() {
                    self.b.rule(t, vec![])?;
                }
                if can_add(c) {
                    let lead = if c > 0 { vec![sep] } else { vec![] };
                    for &(key, value) in &classes {
                        let mut rhs = lead.clone();
                        rhs.extend([key, key_sep, value, Sym::Nt(tail[inc(c)])]);
                        self.b.rule(t, rhs)?;
                    }
                    for &i in &missing {
                        let (key, value) = extra[i];
                        let mut rhs = lead.clone();
                        rhs.extend([key, key_sep, value, Sym::Nt(tails[set | 1 << i][inc(c)])]);
                        self.b.rule(t, rhs)?;
                    }
                }
            }
        }
        // From the last declared property back: next[c] emits the properties after it, c
        // emitted before (c > 0: a separator comes first).
        let mut next = tails[0].clone();
        for (name, s) in props.iter().rev() {
            let key_json = Value::String(name.clone()).to_string();
            let key = self.b.lexeme(&regex_escape(&key_json))?;
            let value = self.schema(s, &format!("{path}/properties/{name}"), depth + 1)?;
            let cur: Vec<u32> = (0..=top).map(|_| self.b.fresh("props")).collect();
            for (c, &nt) in cur.iter().enumerate() {
                self.b.rule(nt, vec![nothing])?;
                if can_add(c) {
                    let mut rhs = if c > 0 { vec![sep] } else { vec![] };
                    rhs.extend([key, key_sep, value, Sym::Nt(next[inc(c)])]);
                    self.b.rule(nt, rhs)?;
                }
                if !required.contains(&name.as_str()) {
                    self.b.rule(nt, vec![Sym::Nt(next[c])])?;
                }
            }
            next = cur;
        }
        let nt = self.b.fresh("object");
        self.b.rule(nt, vec![open, Sym::Nt(next[0]), close])?;
        Ok(Sym::Nt(nt))
    }

    fn array(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Sym, GrammarError> {
        let min = self.count(obj, "minItems", path)?.unwrap_or(0) as usize;
        let max = self.count(obj, "maxItems", path)?.map(|m| m as usize);
        let mut prefix = Vec::new();
        // Drafts 4 to 2019-09: `items` as an array is 2020-12's prefixItems, and
        // `additionalItems` its `items`.
        let (prefix_key, items_key) = match obj.get("items") {
            Some(Value::Array(_)) => ("items", "additionalItems"),
            _ => ("prefixItems", "items"),
        };
        if let Some(p) = obj.get(prefix_key) {
            let Some(p) = p.as_array() else {
                return Err(GrammarError::Grammar(format!(
                    "{path}: {prefix_key} must be an array"
                )));
            };
            for (i, s) in p.iter().enumerate() {
                prefix.push(self.schema(s, &format!("{path}/{prefix_key}/{i}"), depth + 1)?);
            }
        }
        let items = match obj.get(items_key) {
            None | Some(Value::Bool(true)) => Some(self.any_value()?),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(self.schema(s, &format!("{path}/{items_key}"), depth + 1)?),
        };
        let open = self.punct("[")?;
        let close = self.punct("]")?;
        let sep = self.item_sep()?;
        let k = prefix.len();
        let elem = |i: usize| prefix.get(i).copied().or(items);
        // Most items possible (None: unbounded); positions 0..explicit get their own rules,
        // any further items repeat `items`.
        let most = match (max, items) {
            (Some(m), None) => Some(m.min(k)),
            (m, None) => m.or(Some(k)),
            (m, Some(_)) => m,
        };
        if most.is_some_and(|m| min > m) {
            return Err(GrammarError::Grammar(format!(
                "{path}: minItems {min} exceeds the {} items allowed",
                most.unwrap_or(0)
            )));
        }
        match obj.get("uniqueItems") {
            None | Some(Value::Bool(false)) => {}
            // Distinctness is not context-free in general: exact only when no two items
            // can coexist.
            Some(Value::Bool(true)) if most.is_some_and(|m| m <= 1) => {}
            Some(Value::Bool(true)) => {
                // Items from a small finite set of scalars: the set of values used so far
                // is the state (2^n of them).
                let values = obj
                    .get(items_key)
                    .filter(|_| prefix.is_empty() && !obj.contains_key("contains"))
                    .and_then(finite_scalars);
                match values {
                    Some(v) if v.len() <= MAX_UNIQUE_VALUES => {
                        return self.unique_array(&v, min, most);
                    }
                    _ => self.inexact(
                        "uniqueItems",
                        path,
                        Kind::Superset,
                        &format!(
                            "only on arrays of at most one item, or of items from at most \
                             {MAX_UNIQUE_VALUES} listed scalars (not checked)"
                        ),
                    ),
                }
            }
            Some(_) => {
                return Err(GrammarError::Grammar(format!(
                    "{path}: uniqueItems must be a boolean"
                )))
            }
        }
        if let Some(c) = obj.get("contains") {
            let need = self.count(obj, "minContains", path)?.unwrap_or(1);
            if obj.contains_key("maxContains") {
                // At most n matches needs the items that do not match: a negation.
                self.inexact("maxContains", path, Kind::Superset, "not checked");
            }
            if need > 0 {
                let c = c.clone();
                let shape = ArrayShape {
                    min,
                    most,
                    items,
                    prefix: &prefix,
                };
                return self.array_contains(obj, &c, need, shape, path, depth);
            }
        }
        let explicit = most.unwrap_or(k.max(min));
        if explicit > self.b.limits().max_symbols {
            return Err(GrammarError::TooLarge(format!(
                "{path}: an array of {explicit} items exceeds max_symbols"
            )));
        }
        // tail: what may follow the explicit positions.
        let tail = self.b.fresh("items");
        match (most, items) {
            (None, Some(x)) => {
                self.b.rule(tail, vec![Sym::Nt(tail), sep, x])?;
                self.b.rule(tail, vec![])?;
            }
            _ => self.b.rule(tail, vec![])?,
        }
        // next: the items from position i on, each after a separator.
        let mut next = tail;
        for i in (1..explicit).rev() {
            let x = elem(i).expect("positions below `most` have a schema");
            let t = self.b.fresh("items");
            self.b.rule(t, vec![sep, x, Sym::Nt(next)])?;
            if i >= min {
                self.b.rule(t, vec![])?;
            }
            next = t;
        }
        let body = self.b.fresh("array");
        if explicit > 0 || most.is_none() {
            let x = elem(0).expect("a first item is allowed");
            self.b.rule(body, vec![x, Sym::Nt(next)])?;
        }
        if min == 0 {
            self.b.rule(body, vec![])?;
        }
        let nt = self.b.fresh("array");
        self.b.rule(nt, vec![open, Sym::Nt(body), close])?;
        Ok(Sym::Nt(nt))
    }

    /// An array of distinct items from `values` (distinct scalars), `min..=most` of them:
    /// one nonterminal per set of values used so far, each item a value not in it.
    fn unique_array(
        &mut self,
        values: &[Value],
        min: usize,
        most: Option<usize>,
    ) -> Result<Sym, GrammarError> {
        let n = values.len();
        let most = most.unwrap_or(n).min(n);
        if min > most {
            return self.b.lexeme(NOTHING);
        }
        let lits: Vec<Sym> = values
            .iter()
            .map(|v| self.literal(v))
            .collect::<Result<_, _>>()?;
        let sep = self.item_sep()?;
        let nothing = self.b.lexeme(NOTHING)?;
        let sets: Vec<u32> = (0..1u32 << n).map(|_| self.b.fresh("unique")).collect();
        for (used, &nt) in sets.iter().enumerate() {
            let count = used.count_ones() as usize;
            self.b.rule(nt, vec![nothing])?;
            if count >= min && count <= most {
                self.b.rule(nt, vec![])?;
            }
            if count < most {
                for (i, &lit) in lits.iter().enumerate() {
                    if used & (1 << i) == 0 {
                        let mut rhs = if count > 0 { vec![sep] } else { vec![] };
                        rhs.extend([lit, Sym::Nt(sets[used | (1 << i)])]);
                        self.b.rule(nt, rhs)?;
                    }
                }
            }
        }
        let open = self.punct("[")?;
        let close = self.punct("]")?;
        let nt = self.b.fresh("array");
        self.b.rule(nt, vec![open, Sym::Nt(sets[0]), close])?;
        Ok(Sym::Nt(nt))
    }

    /// An array (of `shape`) with at least `need` items matching `contains`: positions are
    /// walked with the matches counted (saturating at `need`); a matching item is compiled
    /// as its position's schema and `contains` together. Unbounded arrays repeat their
    /// last position's rules.
    fn array_contains(
        &mut self,
        obj: &Map<String, Value>,
        contains: &Value,
        need: u64,
        shape: ArrayShape<'_>,
        path: &str,
        depth: usize,
    ) -> Result<Sym, GrammarError> {
        let ArrayShape {
            min,
            most,
            items,
            prefix,
        } = shape;
        let k = prefix.len();
        let last = most.unwrap_or(k.max(min).max(1));
        let need = need as usize;
        if need as u64 > MAX_COUNT || (last + 1).saturating_mul(need + 1) > MAX_COUNT_RULES {
            let detail = format!(
                "counting {need} matches over {last} positions: more than {MAX_COUNT} matches \
                 or {MAX_COUNT_RULES} rules (no array)"
            );
            self.inexact("contains", path, Kind::Subset, &detail);
            return self.b.lexeme(NOTHING);
        }
        // The schemas of each position, as values, to pair with `contains`.
        let (prefix_key, items_key) = match obj.get("items") {
            Some(Value::Array(_)) => ("items", "additionalItems"),
            _ => ("prefixItems", "items"),
        };
        let prefix_values: Vec<Value> = obj
            .get(prefix_key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let items_value = obj.get(items_key).cloned().unwrap_or(Value::Bool(true));
        let matching = |c: &mut Self, schema: &Value, i: usize| -> Result<Sym, GrammarError> {
            let mut m = Map::new();
            m.insert(
                "allOf".into(),
                Value::Array(vec![schema.clone(), contains.clone()]),
            );
            c.schema(
                &Value::Object(m),
                &format!("{path}/contains@{i}"),
                depth + 1,
            )
        };
        let mut elem = Vec::new(); // (plain, matching) per position 0..last
        let mut items_match = None;
        if items.is_some() {
            items_match = Some(matching(self, &items_value, k)?);
        }
        for i in 0..last {
            let pair = match (prefix.get(i), items) {
                (Some(&x), _) => (
                    x,
                    matching(self, prefix_values.get(i).unwrap_or(&Value::Bool(true)), i)?,
                ),
                (None, Some(x)) => (x, items_match.expect("set with items")),
                (None, None) => unreachable!("positions past the prefix need items"),
            };
            elem.push(pair);
        }
        let sep = self.item_sep()?;
        let nothing = self.b.lexeme(NOTHING)?;
        let inc = |j: usize| (j + 1).min(need);
        // n[i][j]: the items from position i on, j matches so far.
        let n: Vec<Vec<u32>> = (0..=last)
            .map(|_| (0..=need).map(|_| self.b.fresh("items")).collect())
            .collect();
        for i in (0..=last).rev() {
            for j in 0..=need {
                let nt = n[i][j];
                self.b.rule(nt, vec![nothing])?;
                if i == last {
                    match (most, items, items_match) {
                        (None, Some(x), Some(xm)) => {
                            // More items of `items`: tail ::= tail sep x | ε, matches anywhere.
                            let tail = self.b.fresh("items");
                            self.b.rule(tail, vec![Sym::Nt(tail), sep, x])?;
                            self.b.rule(tail, vec![])?;
                            if j == need {
                                self.b.rule(nt, vec![Sym::Nt(tail)])?;
                            } else {
                                self.b
                                    .rule(nt, vec![Sym::Nt(tail), sep, xm, Sym::Nt(n[i][j + 1])])?;
                            }
                        }
                        _ if j == need && i >= min => self.b.rule(nt, vec![])?,
                        _ => {}
                    }
                    continue;
                }
                if j == need && i >= min {
                    self.b.rule(nt, vec![])?;
                }
                let (x, xm) = elem[i];
                let lead = if i > 0 { vec![sep] } else { vec![] };
                let mut plain = lead.clone();
                plain.extend([x, Sym::Nt(n[i + 1][j])]);
                self.b.rule(nt, plain)?;
                if j < need {
                    let mut hit = lead;
                    hit.extend([xm, Sym::Nt(n[i + 1][inc(j)])]);
                    self.b.rule(nt, hit)?;
                }
            }
        }
        let open = self.punct("[")?;
        let close = self.punct("]")?;
        let nt = self.b.fresh("array");
        self.b.rule(nt, vec![open, Sym::Nt(n[0][0]), close])?;
        Ok(Sym::Nt(nt))
    }

    /// Any JSON value (`true`, `{}`).
    fn any_value(&mut self) -> Result<Sym, GrammarError> {
        if let Some(a) = self.any {
            return Ok(a);
        }
        let value = self.b.fresh("any");
        self.any = Some(Sym::Nt(value));
        let open_o = self.punct("{")?;
        let close_o = self.punct("}")?;
        let open_a = self.punct("[")?;
        let close_a = self.punct("]")?;
        let sep = self.item_sep()?;
        let key_sep = self.opts.key_separator.clone();
        let key_sep = self.punct(&key_sep)?;
        let string = self.b.lexeme(STRING)?;
        let v = Sym::Nt(value);
        for lex in [STRING, NUMBER, "true|false|null"] {
            let l = self.b.lexeme(lex)?;
            self.b.rule(value, vec![l])?;
        }
        // members ::= members sep string : value | string : value
        let members = self.b.fresh("members");
        self.b
            .rule(members, vec![Sym::Nt(members), sep, string, key_sep, v])?;
        self.b.rule(members, vec![string, key_sep, v])?;
        self.b.rule(value, vec![open_o, close_o])?;
        self.b
            .rule(value, vec![open_o, Sym::Nt(members), close_o])?;
        let elems = self.b.fresh("elements");
        self.b.rule(elems, vec![Sym::Nt(elems), sep, v])?;
        self.b.rule(elems, vec![v])?;
        self.b.rule(value, vec![open_a, close_a])?;
        self.b.rule(value, vec![open_a, Sym::Nt(elems), close_a])?;
        Ok(v)
    }
}

const OBJECT_KEYS: &[&str] = &[
    "minProperties",
    "maxProperties",
    "propertyNames",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
];
const ARRAY_KEYS: &[&str] = &[
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
];
/// Keywords compiled (beside the kind-specific ones).
const GENERAL_KEYS: &[&str] = &[
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
];

/// Is `k` ignored: an annotation, or outside the JSON Schema vocabularies?
fn ignored(k: &str) -> bool {
    ANNOTATIONS.contains(&k)
        || ![
            GENERAL_KEYS,
            OBJECT_KEYS,
            ARRAY_KEYS,
            STRING_KEYS,
            NUMBER_KEYS,
            NOT_YET,
        ]
        .iter()
        .any(|keys| keys.contains(&k))
}
const STRING_KEYS: &[&str] = &["pattern", "minLength", "maxLength", "format"];
const NUMBER_KEYS: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// ECMA-262's white space and line terminators (`\s`), as a class body.
const ECMA_SPACE: &str = r"\t\n\x0B\x0C\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";

/// ECMA-262 reads `\d` and `\w` as ASCII (the regex engine here as Unicode): spell them out.
/// (`\D`, `\W` outside classes too; inside a class they are left alone.)
fn ecma_classes(p: &str) -> String {
    let mut out = String::new();
    let (mut chars, mut class) = (p.chars(), false);
    while let Some(c) = chars.next() {
        match c {
            '\\' => match (chars.next(), class) {
                (Some('d'), false) => out.push_str("[0-9]"),
                (Some('d'), true) => out.push_str("0-9"),
                (Some('w'), false) => out.push_str("[0-9A-Za-z_]"),
                (Some('w'), true) => out.push_str("0-9A-Za-z_"),
                (Some('D'), false) => out.push_str("[^0-9]"),
                (Some('W'), false) => out.push_str("[^0-9A-Za-z_]"),
                (Some('s'), false) => out.push_str(&format!("[{ECMA_SPACE}]")),
                (Some('s'), true) => out.push_str(ECMA_SPACE),
                (Some('S'), false) => out.push_str(&format!("[^{ECMA_SPACE}]")),
                (Some(e), _) => {
                    out.push('\\');
                    out.push(e);
                }
                (None, _) => out.push('\\'),
            },
            '[' if !class => {
                class = true;
                out.push(c);
            }
            ']' if class => {
                class = false;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// The regex of no text at all (the false schema's lexeme).
const NOTHING: &str = "[^\\x{0}-\\x{10FFFF}]";

/// What `propertyNames` allows.
struct NameFilter {
    /// What it checks, in words (to tell key automata apart).
    desc: Vec<String>,
    /// Automata over a name's characters, all to match (declared names are checked exactly).
    raw: Vec<TableDfa>,
    /// The names `const`/`enum` list, if they do.
    listed: Option<Vec<String>>,
}

impl NameFilter {
    fn allows(&self, name: &str) -> bool {
        let listed = match &self.listed {
            Some(l) => l.iter().any(|x| x == name),
            None => true,
        };
        listed
            && self
                .raw
                .iter()
                .all(|d| d.is_accepting(d.run(d.start(), name.as_bytes())))
    }
}

/// Most undeclared required properties generated in any order (2^n sets tracked).
const MAX_ANY_ORDER: usize = 3;

/// Most distinct values `uniqueItems` tracks (2^n sets).
const MAX_UNIQUE_VALUES: usize = 8;

/// The values a schema allows when they are a finite set of distinct scalars (`enum`,
/// `const`, `type` boolean or null, with annotations only beside them); `None` otherwise.
fn finite_scalars(s: &Value) -> Option<Vec<Value>> {
    let o = s.as_object()?;
    if o.keys()
        .any(|k| !["enum", "const", "type"].contains(&k.as_str()) && !ignored(k))
    {
        return None;
    }
    let kinds: Option<Vec<&str>> = match o.get("type") {
        None => None,
        Some(Value::String(t)) => Some(vec![t.as_str()]),
        Some(Value::Array(ts)) => Some(ts.iter().filter_map(Value::as_str).collect()),
        Some(_) => return None,
    };
    let listed: Vec<Value> = match (o.get("const"), o.get("enum"), &kinds) {
        (Some(c), _, _) => vec![c.clone()],
        (None, Some(Value::Array(e)), _) => e.clone(),
        (None, None, Some(ks)) if ks.iter().all(|k| ["boolean", "null"].contains(k)) => ks
            .iter()
            .flat_map(|k| match *k {
                "boolean" => vec![Value::Bool(false), Value::Bool(true)],
                _ => vec![Value::Null],
            })
            .collect(),
        _ => return None,
    };
    let mut out: Vec<Value> = Vec::new();
    for v in listed {
        let kind_ok = match (&kinds, &v) {
            (None, _) => true,
            (Some(ks), Value::Null) => ks.contains(&"null"),
            (Some(ks), Value::Bool(_)) => ks.contains(&"boolean"),
            (Some(ks), Value::String(_)) => ks.contains(&"string"),
            (Some(ks), Value::Number(_)) if ks.contains(&"number") => true,
            // Which numbers `integer` keeps (1.0 is one) is left to the general path.
            (Some(ks), Value::Number(_)) if ks.contains(&"integer") => return None,
            (Some(_), Value::Number(_)) => false,
            _ => return None, // arrays and objects: equality is not checked here
        };
        if !kind_ok {
            continue;
        }
        // JSON Schema equality: numbers by value (1 and 1.0 are one value).
        let same = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        };
        match &v {
            Value::Array(_) | Value::Object(_) => return None,
            _ if out.iter().any(|w| same(w, &v)) => {}
            _ => out.push(v),
        }
    }
    Some(out)
}

/// An array's positions: `min` items at least, `most` at most (`None`: unbounded), the
/// compiled prefix schemas and the schema of the items after them (`None`: no more items).
#[derive(Clone, Copy)]
struct ArrayShape<'a> {
    min: usize,
    most: Option<usize>,
    items: Option<Sym>,
    prefix: &'a [Sym],
}

/// Most trigger properties `dependentRequired`/`dependentSchemas` expand (2^n alternatives).
const MAX_DEP_TRIGGERS: usize = 5;

/// Most properties `minProperties`/`maxProperties` count, and most rules the counting chain
/// may take (counts times declared properties).
const MAX_COUNT: u64 = 64;
const MAX_COUNT_RULES: usize = 4096;

/// Assertions and applicators of drafts 4 to 2020-12 not compiled (yet).
const NOT_YET: &[&str] = &[
    "unevaluatedProperties",
    "unevaluatedItems",
    "divisibleBy",
    "$dynamicRef",
    "$recursiveRef",
    "extends",
    "disallow",
];

/// Formats the spec defines (2020-12) beside the supported ones.
const SPEC_FORMATS: &[&str] = &["idn-email", "hostname", "idn-hostname", "regex"];

/// Most fraction digits of an integer written with an exponent (a float's shortest text
/// has at most 17 significant digits).
const MAX_EXPONENT_FRACTION: u32 = 16;

/// Integer texts with an exponent, as floats are printed: `-?d[.frac]` (one integer digit,
/// at most [`MAX_EXPONENT_FRACTION`] fraction digits), `e` or `E`, an optional `+` and an
/// exponent (leading zeros allowed) of at least the fraction's length plus `shift`: each
/// such text is an integer (times `10^shift`). The value stays below 1.7e308, so that
/// every reader's double is finite; exponents below the bound, or negative, are not
/// accepted.
fn exponent_regex(shift: u32) -> String {
    const TOP: u32 = 308;
    let mut alts = Vec::new();
    for f in 0..=MAX_EXPONENT_FRACTION {
        let least = f + shift;
        let frac = match f {
            0 => String::new(),
            f => format!("\\.[0-9]{{{f}}}"),
        };
        if least < TOP {
            let range = int_range_regex(Some(i64::from(least)), Some(i64::from(TOP - 1)));
            alts.push(format!("[0-9]{frac}[eE]\\+?0*{range}"));
        }
        if least <= TOP {
            // 1.0e308 to 1.6...e308: below the largest double (1.797...e308).
            let frac = match f {
                0 => String::new(),
                f => format!("\\.[0-6][0-9]{{{}}}", f - 1),
            };
            alts.push(format!("1{frac}[eE]\\+?0*{TOP}"));
        }
    }
    format!("-?(?:{})", alts.join("|"))
}

/// A decimal bound `-?int.frac` (frac without trailing zeros), exact for JSON's literals.
struct Decimal {
    neg: bool,
    int: i64,
    frac: Vec<u8>,
}

/// Unsigned decimal magnitudes, no exponent.
const MAG: &str = r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?";
const FRAC_ANY: &str = r"(?:\.[0-9]+)?";

impl Decimal {
    fn parse(v: &Value, x: f64) -> Option<Decimal> {
        if x.abs() >= 9.2e18 {
            return None;
        }
        // Integers exactly as written; floats through `Display`, which never uses an exponent.
        let text = match (v.as_i64(), v.as_u64()) {
            (Some(i), _) => i.to_string(),
            (_, Some(u)) => u.to_string(),
            _ => format!("{x}"),
        };
        let (neg, text) = match text.strip_prefix('-') {
            Some(t) => (true, t),
            None => (false, text.as_str()),
        };
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        let frac = frac.trim_end_matches('0').as_bytes().to_vec();
        let int: i64 = int.parse().ok()?;
        let neg = neg && (int != 0 || !frac.is_empty());
        Some(Decimal { neg, int, frac })
    }

    /// The signed number texts above (`is_lo`) or below this bound.
    fn regex(&self, is_lo: bool, strict: bool) -> String {
        let negative = format!("-{}", self.mag_gt_zero());
        match (is_lo, self.neg) {
            (true, false) => self.mag_ge(strict),
            (true, true) => alts(vec![MAG.to_owned(), format!("-{}", self.mag_le(strict))]),
            (false, false) => alts(vec![negative, self.mag_le(strict)]),
            (false, true) => format!("-{}", self.mag_ge(strict)),
        }
    }

    fn mag_gt_zero(&self) -> String {
        Decimal {
            neg: false,
            int: 0,
            frac: Vec::new(),
        }
        .mag_ge(true)
    }

    /// Magnitudes >= (or >, `strict`) this one's absolute value.
    fn mag_ge(&self, strict: bool) -> String {
        let mut out = vec![format!(
            "{}{FRAC_ANY}",
            int_range_regex(Some(self.int + 1), None)
        )];
        let mut f = Vec::new();
        for (i, &d) in self.frac.iter().enumerate() {
            if d < b'9' {
                f.push(format!(
                    "{}[{}-9][0-9]*",
                    digits(&self.frac[..i]),
                    (d + 1) as char
                ));
            }
        }
        let exact = digits(&self.frac);
        if strict {
            f.push(format!("{exact}[0-9]*[1-9][0-9]*"));
        } else if self.frac.is_empty() {
            f.push("[0-9]+".into());
        } else {
            f.push(format!("{exact}[0-9]*"));
        }
        let mut tail = format!("\\.{}", alts(f));
        if !strict && self.frac.is_empty() {
            tail = format!("(?:{tail})?");
        }
        out.push(format!("{}{tail}", self.int));
        alts(out)
    }

    /// Magnitudes <= (or <, `strict`) this one's absolute value.
    fn mag_le(&self, strict: bool) -> String {
        let mut out = Vec::new();
        if self.int > 0 {
            out.push(format!(
                "{}{FRAC_ANY}",
                int_range_regex(Some(0), Some(self.int - 1))
            ));
        }
        // Fractions below `frac` (none at all is zero).
        let mut f = Vec::new();
        for (i, &d) in self.frac.iter().enumerate() {
            let prefix = digits(&self.frac[..i]);
            if d > b'0' {
                f.push(format!("{prefix}[0-{}][0-9]*", (d - 1) as char));
            }
            if i > 0 {
                f.push(prefix);
            }
        }
        if !strict {
            f.push(match self.frac.is_empty() {
                true => "0+".into(),
                false => format!("{}0*", digits(&self.frac)),
            });
        }
        let below_zero_frac = strict && self.frac.is_empty();
        if !below_zero_frac {
            f.retain(|x| !x.is_empty());
            let tail = if f.is_empty() {
                String::new()
            } else {
                format!("(?:\\.{})?", alts(f))
            };
            out.push(format!("{}{tail}", self.int));
        }
        if out.is_empty() {
            // Nothing below zero in magnitude.
            return "[^\\x{0}-\\x{10FFFF}]".into();
        }
        alts(out)
    }
}

fn digits(d: &[u8]) -> String {
    String::from_utf8_lossy(d).into_owned()
}

fn alts(v: Vec<String>) -> String {
    format!("(?:{})", v.join("|"))
}
