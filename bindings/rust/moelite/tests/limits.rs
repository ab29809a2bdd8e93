//! Arguments crossing into C (issue 61, item 2): a slice's length goes to the C API as an
//! `int32_t` count, and `len as i32` kept its low 32 bits, so a slice of 2^32 + 1 items passed
//! as one. Such slices are refused now (INVALID_ARGUMENT), before the library reads them. NUL
//! inside a string the C API takes NUL-terminated is refused too; text passed with a length
//! (tokenize, generate_text) may hold NUL.
use std::os::raw::{c_int, c_void};

use moelite::{ChatMessage, Context, ContextParams, GenerateParams, Model, Sampler, Status};

mod common;
use common::{cpu, model_path};

/// 2^32 + 1 zeros, readable and never written: a private read-only anonymous mapping, which the
/// kernel backs with the zero page and does not count against memory (MAP_NORESERVE), so the
/// 16 GiB cost nothing unless read. None where the mapping is refused.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
struct Zeros {
    ptr: *mut c_void,
    bytes: usize,
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
impl Zeros {
    const N: usize = (1 << 32) + 1;

    fn map() -> Option<Zeros> {
        extern "C" {
            fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
        }
        // The same values on every 64-bit Linux (asm-generic): PROT_READ, MAP_PRIVATE,
        // MAP_ANONYMOUS, MAP_NORESERVE.
        let (prot_read, map_private, map_anonymous, map_noreserve) = (1, 2, 0x20, 0x4000);
        let bytes = Self::N * 4;
        let ptr = unsafe {
            mmap(std::ptr::null_mut(), bytes, prot_read, map_private | map_anonymous | map_noreserve, -1, 0)
        };
        if ptr as isize == -1 {
            eprintln!("skipped: a 16 GiB read-only mapping was refused");
            return None;
        }
        Some(Zeros { ptr, bytes })
    }
    fn ids(&self) -> &[i32] {
        unsafe { std::slice::from_raw_parts(self.ptr as *const i32, Self::N) }
    }
    fn floats(&self) -> &[f32] {
        unsafe { std::slice::from_raw_parts(self.ptr as *const f32, Self::N) }
    }
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
impl Drop for Zeros {
    fn drop(&mut self) {
        extern "C" {
            fn munmap(addr: *mut c_void, len: usize) -> c_int;
        }
        unsafe { munmap(self.ptr, self.bytes) };
    }
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[test]
fn slices_longer_than_an_int32_count_are_refused_not_cut() {
    let Some(zeros) = Zeros::map() else { return };
    let model = Model::load(model_path(), &cpu(1)).unwrap();
    let refused = |what: &str, e: moelite::Error| {
        assert_eq!(e.status, Status::INVALID_ARGUMENT, "{what}: {e}");
        assert!(e.message.contains("int32_t"), "{what}: {e}");
    };
    // Was: the text of token 0 alone.
    refused("detokenize", model.detokenize_bytes(zeros.ids(), false).unwrap_err());
    let mut s = Sampler::new(&GenerateParams::new()).unwrap();
    // Was: one token accepted.
    refused("accept", s.accept(zeros.ids()).unwrap_err());
    // Was: a draw from a vocabulary of one (token 0).
    refused("sample_logits", s.sample_logits(zeros.floats()).unwrap_err());
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(16)).unwrap();
    refused("eval", ctx.eval(zeros.ids(), false).unwrap_err());
    assert_eq!(ctx.kv_length(), 0);
}

#[test]
fn nul_in_c_strings_is_refused_and_kept_in_text_with_a_length() {
    let path = model_path();
    let with_nul = format!("{}\0.ignored", path.display());
    let e = Model::load(&with_nul, &cpu(1)).err().expect("a path with NUL was loaded");
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    let model = Model::load(&path, &cpu(1)).unwrap();
    let msgs = [ChatMessage::new("user", "hi\0<|im_end|>")];
    assert_eq!(model.chat_format(&msgs, true).unwrap_err().status, Status::INVALID_ARGUMENT);
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(32)).unwrap();
    let stop = GenerateParams::new().max_tokens(2).stop("a\0b");
    assert_eq!(ctx.generate_text("x", &stop).unwrap_err().status, Status::INVALID_ARGUMENT);
    let dir = std::env::temp_dir().join(format!("moelite-rust-nul-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("session");
    ctx.eval(&[1, 2], false).unwrap();
    assert_eq!(ctx.save(format!("{}\0.tmp", target.display())).unwrap_err().status, Status::INVALID_ARGUMENT);
    assert!(!target.exists());
    // tokenize takes its text with a length: NUL is text there.
    let ids = model.tokenize("a\0b", false, false).unwrap();
    assert_eq!(model.detokenize_bytes(&ids, false).unwrap(), b"a\0b");
    std::fs::remove_dir_all(&dir).ok();
}
