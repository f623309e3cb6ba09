//! The one way binding calls block: with the GIL released.
//!
//! [`detached`] runs a call with the GIL released, so other Python threads run meanwhile
//! (vLLM submits from many threads at once). A call that waits polls the `interrupted`
//! check it is given: on the process's main thread that briefly re-attaches and runs
//! Python's signal handlers, so Ctrl-C cancels the wait and raises `KeyboardInterrupt`;
//! elsewhere it is free (Python runs handlers on the main thread only).

use parking_lot::Mutex;
use pyo3::prelude::*;

/// Runs `f` with the GIL released; a `KeyboardInterrupt` (or any exception a signal
/// handler raised) while `f` waited is returned as the error.
pub fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce(&dyn Fn() -> bool) -> T + Send,
    T: Send,
{
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let main = on_main_thread();
    let out = py.detach(|| {
        let interrupted = || main && check_signals(&raised);
        f(&interrupted)
    });
    match raised.into_inner() {
        Some(err) => Err(err),
        None => Ok(out),
    }
}

fn check_signals(raised: &Mutex<Option<PyErr>>) -> bool {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(err) => {
            *raised.lock() = Some(err);
            true
        }
    })
}

fn on_main_thread() -> bool {
    // SAFETY: getpid and gettid have no preconditions.
    unsafe { libc::getpid() == libc::gettid() }
}
