//! Compile-fail tests: each program under `tests/compile_fail/` is an unsound use of
//! the safe API that must be refused by the compiler (a lifetime, a missing `unsafe`,
//! a sealed or `unsafe` trait). The expected compiler output sits beside each program
//! (`.stderr`); regenerate it with `TRYBUILD=overwrite cargo test --test compile_fail`
//! after checking that the new message still names the reason. Beside them, the
//! programs under `tests/compile_pass/` are forms the API promises to accept (they are
//! compiled and run; they do no GPU work).

#[test]
fn unsound_programs_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
    t.pass("tests/compile_pass/*.rs");
}
