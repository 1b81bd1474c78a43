//! The mutable state of a `#[pyclass(frozen)]` behind a mutex, so that a second Python thread
//! calling into the same object waits for the first instead of failing with PyO3's "Already
//! borrowed" (which a `&mut self` method meets as soon as another thread runs while it has
//! the GIL released).
//!
//! Deadlock rule: no thread ever needs the GIL while it holds the lock. The state is reached
//! only inside a `Send` closure, which can capture neither a `Python` token nor a `Bound`
//! object; callers convert arguments before the call, and make Python errors (which takes
//! the GIL) and numpy results after it. A thread that finds the lock taken waits with the GIL released (except in
//! [`Locked::holding_gil`], whose callers need the GIL kept), so other Python threads run on.
//!
//! Poisoning: a panic inside a critical section (a bug: the core reports bad input as errors)
//! reaches Python as PyO3's `PanicException` at the call that panicked, and the state it
//! leaves is taken over as it stands (`into_inner`), just as a plain `&mut self` pyclass
//! keeps it. Raising on every later call instead would make a server's one shared object
//! unusable without making its state any more trustworthy (a `BlockManager`'s
//! `check_invariants` tells whether it is).

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use pyo3::prelude::*;

pub struct Locked<T>(Mutex<T>);

impl<T: Send> Locked<T> {
    pub fn new(value: T) -> Self {
        Locked(Mutex::new(value))
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run `f` on the state: at once when the lock is free (the GIL stays held: a short call
    /// is not worth a round trip), else after waiting for it with the GIL released.
    pub fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R + Send) -> R {
        match self.0.try_lock() {
            Ok(mut guard) => f(&mut guard),
            Err(TryLockError::Poisoned(e)) => f(&mut e.into_inner()),
            Err(TryLockError::WouldBlock) => py.detach(|| f(&mut self.lock())),
        }
    }

    /// Run `f` on the state with the GIL released (heavy work): the lock is taken, and
    /// waited for, only once the GIL is gone.
    pub fn detached<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R + Send) -> R {
        py.detach(|| f(&mut self.lock()))
    }

    /// Run `f` on the state without ever releasing the GIL, waiting for the lock if need be:
    /// for work on memory that only the GIL keeps alive (a view into another object's
    /// buffer). Safe from deadlock because no holder of the lock waits for the GIL.
    pub fn holding_gil<R>(&self, _py: Python<'_>, f: impl FnOnce(&mut T) -> R + Send) -> R {
        f(&mut self.lock())
    }
}
