// Included by the build script and by `config`'s tests.

/// The kind of build the codegen options in `flags` (separated by 0x1f, as cargo passes
/// them) make: `-C profile-use=…` or `-C profile-generate=…` in any of rustc's spellings.
fn build_kind(flags: &str) -> &'static str {
    let mut codegen = false;
    let mut kind = "standard build";
    for flag in flags.split('\x1f') {
        let option = if codegen {
            flag
        } else if let Some(o) = flag.strip_prefix("--codegen=").or_else(|| flag.strip_prefix("-C")) {
            o
        } else {
            codegen = flag == "--codegen";
            continue;
        };
        codegen = option.is_empty();
        if option.starts_with("profile-use") {
            kind = "profile-guided build";
        } else if option.starts_with("profile-generate") {
            kind = "instrumented for PGO";
        }
    }
    kind
}
