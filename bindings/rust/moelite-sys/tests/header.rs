//! Keeps src/lib.rs equal to include/moelite.h: every function (name, parameter and return types),
//! every constant (#define, enum value), every callback type and every struct (field names and
//! types) of the header must be declared here the same way, and nothing here may be missing from
//! the header. A C type maps to one Rust spelling (`rust_type`), so a changed signature, a new
//! function or a renumbered enum fails this test until the declarations are updated by hand.
use std::collections::BTreeMap;

fn read(rel: &str) -> String {
    let path = format!("{}/{}", env!("CARGO_MANIFEST_DIR"), rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The header without comments and deprecation attributes, from the version macros on (the
/// export macros above them are not declarations).
fn header_text() -> String {
    let src = read("../../../include/moelite.h");
    let mut out = String::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    let out: String = out.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
    let mut clean = String::new();
    let mut rest = out.as_str();
    while let Some(i) = rest.find("MOELITE_DEPRECATED(\"") {
        clean.push_str(&rest[..i]);
        rest = &rest[i + rest[i..].find(')').unwrap() + 1..];
    }
    clean.push_str(rest);
    let start = clean.find("#define MOELITE_VERSION_MAJOR").expect("version macros");
    clean[start..].to_string()
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The one Rust spelling of a C type.
fn rust_type(c: &str) -> String {
    let c = squash(&c.replace('*', " * "));
    let stars = c.matches('*').count();
    let base = c.replace('*', "");
    let base = squash(&base);
    let is_const = base.starts_with("const ");
    let base = base.trim_start_matches("const ").trim();
    let prim = match base {
        "int32_t" => "i32",
        "int64_t" => "i64",
        "uint32_t" => "u32",
        "uint64_t" => "u64",
        "uint8_t" => "u8",
        "size_t" => "usize",
        "float" => "f32",
        "double" => "f64",
        "int" => "c_int",
        "unsigned" => "c_uint",
        "char" => "c_char",
        "void" => "c_void",
        other => other,
    };
    if stars == 0 {
        return prim.to_string();
    }
    let mut t = format!("{} {}", if is_const { "*const" } else { "*mut" }, prim);
    for _ in 1..stars {
        t = format!("*mut {t}");
    }
    t
}

/// "const char* text" -> the type's Rust spelling (the parameter name is dropped).
fn param_type(p: &str) -> String {
    let p = squash(p);
    let name_at = p.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    rust_type(&p[..name_at])
}

fn params_of(args: &str) -> Vec<String> {
    let args = squash(args);
    if args == "void" || args.is_empty() {
        return vec![];
    }
    args.split(',').map(param_type).collect()
}

/// name -> "(types) -> ret" of every function of the header.
fn header_functions(h: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for piece in h.split("MOELITE_API").skip(1) {
        let decl = squash(&piece[..piece.find(';').unwrap()]);
        let open = decl.find('(').unwrap();
        let head = &decl[..open];
        let name_at = head.rfind(' ').map_or(0, |i| i + 1);
        let (ret, name) = (head[..name_at].trim(), head[name_at..].trim());
        let ret = if ret == "void" { String::new() } else { rust_type(ret) };
        let args = params_of(&decl[open + 1..decl.rfind(')').unwrap()]);
        out.insert(name.to_string(), format!("({}) -> {}", args.join(", "), ret));
    }
    out
}

/// The same from src/lib.rs's `pub fn name(a: T, ...) -> R;` lines.
fn rust_functions(rs: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in rs.lines().map(str::trim).filter(|l| l.starts_with("pub fn ")) {
        let line = line.trim_start_matches("pub fn ").trim_end_matches(';');
        let open = line.find('(').unwrap();
        let close = line.rfind(')').unwrap();
        let args: Vec<String> = line[open + 1..close]
            .split(", ")
            .filter(|a| !a.is_empty())
            .map(|a| squash(&a[a.find(':').unwrap() + 1..]))
            .collect();
        let ret = line[close + 1..].trim().trim_start_matches("->").trim().to_string();
        out.insert(line[..open].to_string(), format!("({}) -> {}", args.join(", "), ret));
    }
    out
}

/// NAME -> value of every #define of a number and every enum constant.
fn header_constants(h: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in h.lines().map(str::trim).filter(|l| l.starts_with("#define MOELITE_")) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() == 3 {
            if let Ok(v) = parts[2].parse::<i64>() {
                out.insert(parts[1].to_string(), v);
            }
        }
    }
    let mut rest = h;
    while let Some(i) = rest.find("enum") {
        rest = &rest[i + 4..];
        // (match, not let-else: Debian 12's Rust 1.63 builds this too)
        let (open, close) = match (rest.find('{'), rest.find('}')) {
            (Some(o), Some(c)) => (o, c),
            _ => break,
        };
        if open > close || rest[..open].contains(';') {
            continue;
        }
        for item in rest[open + 1..close].split(',') {
            let item = squash(item);
            if let Some((k, v)) = item.split_once('=') {
                out.insert(k.trim().to_string(), v.trim().parse().unwrap());
            }
        }
        rest = &rest[close..];
    }
    out
}

fn rust_constants(rs: &str) -> BTreeMap<String, String> {
    rs.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("pub const MOELITE_"))
        .map(|l| {
            let l = l.trim_start_matches("pub const ").trim_end_matches(';');
            let (name, value) = l.split_once(" = ").unwrap();
            (name.split(':').next().unwrap().to_string(), value.to_string())
        })
        .collect()
}

/// Struct name -> "field: type, ..." from `typedef struct X { ... } X;` in the header.
fn header_structs(h: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for piece in h.split("typedef struct ").skip(1) {
        let open = match piece.find('{') {
            Some(o) => o,
            None => continue,
        };
        if piece[..open].contains(';') {
            continue; // an opaque type
        }
        let name = piece[..open].trim().to_string();
        let body = &piece[open + 1..piece.find('}').unwrap()];
        let fields: Vec<String> = body
            .split(';')
            .map(squash)
            .filter(|f| !f.is_empty())
            .map(|f| {
                let at = f.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap() + 1;
                format!("{}: {}", &f[at..], rust_type(&f[..at]))
            })
            .collect();
        out.insert(name, fields.join(", "));
    }
    out
}

fn rust_structs(rs: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for piece in rs.split("pub struct ").skip(1) {
        let open = piece.find('{').unwrap();
        let name = piece[..open].trim().to_string();
        let body = &piece[open + 1..piece.find('}').unwrap()];
        if body.contains("_private") {
            continue;
        }
        let fields: Vec<String> = body
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("pub "))
            .map(|l| squash(l.trim_start_matches("pub ").trim_end_matches(',')))
            .collect();
        out.insert(name, fields.join(", "));
    }
    out
}

/// Opaque handle names of the header (`typedef struct X X;`).
fn header_opaque(h: &str) -> Vec<String> {
    h.split("typedef struct ")
        .skip(1)
        .filter_map(|p| {
            let end = p.find(';')?;
            let decl = squash(&p[..end]);
            let parts: Vec<&str> = decl.split(' ').collect();
            (parts.len() == 2 && parts[0] == parts[1]).then(|| parts[0].to_string())
        })
        .collect()
}

/// Callback name -> "(types) -> ret".
fn header_callbacks(h: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for piece in h.split("typedef ").skip(1) {
        let decl = squash(&piece[..piece.find(';').unwrap_or(0)]);
        let star = match decl.find("(*") {
            Some(s) => s,
            None => continue,
        };
        let ret = decl[..star].trim();
        let name_end = decl[star..].find(')').unwrap() + star;
        let name = &decl[star + 2..name_end];
        let args = &decl[name_end + 2..decl.rfind(')').unwrap()];
        let ret = if ret == "void" { String::new() } else { rust_type(ret) };
        out.insert(name.to_string(), format!("({}) -> {}", params_of(args).join(", "), ret));
    }
    out
}

fn rust_callbacks(rs: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in rs.lines().map(str::trim).filter(|l| l.contains("= Option<unsafe extern \"C\" fn(")) {
        let name = line.trim_start_matches("pub type ").split(' ').next().unwrap().to_string();
        let open = line.find("fn(").unwrap() + 3;
        let close = line.rfind(')').unwrap();
        let args: Vec<String> = line[open..close]
            .split(", ")
            .filter(|a| !a.is_empty())
            .map(|a| squash(&a[a.find(':').unwrap() + 1..]))
            .collect();
        let ret = line[close + 1..].trim_end_matches(">;").trim().trim_start_matches("->").trim().to_string();
        out.insert(name, format!("({}) -> {}", args.join(", "), ret));
    }
    out
}

#[test]
fn every_function_matches_the_header() {
    let h = header_text();
    let rs = read("src/lib.rs");
    let (want, have) = (header_functions(&h), rust_functions(&rs));
    assert!(want.len() > 100, "the header parser found only {} functions", want.len());
    for (name, sig) in &want {
        assert_eq!(have.get(name), Some(sig), "{name}: the header has {sig}");
    }
    for name in have.keys() {
        assert!(want.contains_key(name), "{name} is declared but not in the header");
    }
}

#[test]
fn every_constant_matches_the_header() {
    let h = header_text();
    let rs = read("src/lib.rs");
    let (want, have) = (header_constants(&h), rust_constants(&rs));
    assert!(want.contains_key("MOELITE_ERR_INTERNAL") && want.contains_key("MOELITE_TOKENIZE_ADD_SPECIAL"));
    for (name, value) in &want {
        let got = have.get(name).unwrap_or_else(|| panic!("{name} (= {value}) is not declared"));
        assert_eq!(got.parse::<i64>().ok(), Some(*value), "{name}: the header says {value}, lib.rs {got}");
    }
    // Those the header computes with an expression: declared here by hand.
    let computed = ["MOELITE_VERSION_NUMBER", "MOELITE_MAX_BUDGET_HEADROOM", "MOELITE_PLAN_BUDGET_AUTO", "MOELITE_PLAN_RESIDENT"];
    for name in have.keys() {
        assert!(want.contains_key(name) || computed.contains(&name.as_str()), "{name} is not in the header");
    }
    for name in computed {
        assert!(h.contains(&format!("#define {name} ")), "{name} is no longer in the header");
    }
}

#[test]
fn every_struct_and_callback_matches_the_header() {
    let h = header_text();
    let rs = read("src/lib.rs");
    assert_eq!(header_structs(&h), rust_structs(&rs));
    assert_eq!(header_callbacks(&h), rust_callbacks(&rs));
    for name in header_opaque(&h) {
        assert!(rs.contains(&format!("pub struct {name} {{\n    _private: [u8; 0],")), "opaque {name} missing");
    }
}

#[test]
fn constants_and_layout_agree_with_the_linked_library() {
    use moelite_sys::*;
    // The version the library reports is the one declared.
    assert_eq!(unsafe { moelite_version_number() }, MOELITE_VERSION_NUMBER);
    // A struct_size-versioned struct: the library writes every field of ours.
    let mut s = std::mem::MaybeUninit::<moelite_expert_stats>::zeroed();
    unsafe { (*s.as_mut_ptr()).struct_size = std::mem::size_of::<moelite_expert_stats>() };
    assert_eq!(unsafe { moelite_model_expert_stats(std::ptr::null(), -1, s.as_mut_ptr()) }, MOELITE_ERR_INVALID_ARGUMENT);
    let name = unsafe { std::ffi::CStr::from_ptr(moelite_status_name(MOELITE_ERR_SESSION_MISMATCH)) };
    assert_eq!(name.to_str().unwrap(), "MOELITE_ERR_SESSION_MISMATCH");
}
