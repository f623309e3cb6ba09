//! The `main` of a test child binary (`te-test-child`, and e2e's `e2e-test-child`): plays
//! the role its first argument names, then prints `<binary>: done`, so that the parent
//! knows the role ran to its end (a role that panics, or exits, never prints it).

/// A role: the name a test starts it with, and its body.
pub type Role = (&'static str, fn());

/// Plays the role of `std::env::args()`' first argument among `roles`; exits with 2,
/// naming them, when it is none of them.
pub fn play(binary: &str, roles: &[Role]) {
    let role = std::env::args().nth(1).unwrap_or_default();
    let Some((_, body)) = roles.iter().find(|(name, _)| *name == role) else {
        let names: Vec<&str> = roles.iter().map(|(name, _)| *name).collect();
        eprintln!("{binary}: no role {role:?}; the roles: {names:?}");
        std::process::exit(2);
    };
    body();
    println!("{binary}: done");
}
