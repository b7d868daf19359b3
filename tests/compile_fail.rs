//! Compile-fail tests of the shim's Rust surface: each program under
//! `tests/compile_fail/` must be refused by the compiler. Regenerate the expected
//! output with `TRYBUILD=overwrite cargo test --test compile_fail` after checking that
//! the new message still names the reason.

#[test]
fn unsound_programs_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
