//! The directory moelite-sys found libmoelite in goes on the run-time search path of this
//! crate's tests (an application linking the library sets its own, or installs it).
fn main() {
    if let Ok(dirs) = std::env::var("DEP_MOELITE_LIB_DIR") {
        for d in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{d}");
        }
    }
}
