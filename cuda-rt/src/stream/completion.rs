//! The completion of a stream's queued work, or of an event's last record, as a
//! [`Future`]: [`AsStream::completion`](super::AsStream::completion) and
//! [`Event::completion`](crate::Event::completion).
//!
//! # How it wakes
//!
//! Making a [`Completion`] queues a stream callback (`cuStreamAddCallback`) that holds
//! the future's shared state: when the work queued before it is done, the driver
//! calls it on one of its threads, and it stores the outcome and wakes the task that
//! last polled the future. That is all it does there: no CUDA call (CUDA forbids them
//! in a callback; cuda-rt refuses them with
//! [`StateKind::InHostFunction`]), no polling, no
//! runtime: any executor's [`Waker`] works, so tokio, async-std, smol or
//! `futures::executor::block_on` can `.await` it.
//!
//! The wake runs on the driver's thread: executors queue the task there and poll it on
//! their own threads (tokio, async-std, smol and `futures` all do). An executor whose
//! waker polled the task inline would run it where cuda-rt refuses CUDA calls.
//!
//! `cuStreamAddCallback` rather than `cuLaunchHostFunc`: after a device error in the
//! context (an illegal address, a trap) the driver still calls a stream callback, with
//! the error, so the future resolves to that error; a host function would not be called
//! at all and the future would never complete.
//!
//! # Dropping it early
//!
//! The callback owns a reference to the signal (a boxed closure handed to the driver
//! and taken back, once, when it runs), so dropping the future before the work is done
//! frees nothing the callback uses: the work runs to its end, the callback finds no
//! task to wake and releases the signal. A dropped future also forgets its waker at
//! once, so the callback never wakes a task that no longer waits.
//!
//! # During a capture
//!
//! A capturing stream's work goes into the graph, so its completion is refused (an
//! error, the capture goes on). [`Event::completion`](crate::Event::completion) first
//! asks the driver whether the event is done (`cuEventQuery`), which also tells an
//! event recorded in a capture apart; like [`Event::query`](crate::Event::query), that
//! question is one CUDA refuses while a global-mode capture is under way on another
//! thread (or a non-relaxed one on this thread), and the completion resolves to that
//! error, explained.
//!
//! # When it cannot complete
//!
//! If the context is destroyed or reset (`cuDevicePrimaryCtxReset` by other code) while
//! the work is queued, the driver drops its callbacks: the future stays pending. Where
//! that can happen, bound the wait (`tokio::time::timeout`). A device error is not such
//! a case: see above.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use cuda_sys::driver as sys;
use cuda_sys::result::{self, DriverError};

use crate::device::context::make_current;
use crate::error::{CaptureKind, Error, Result, StateKind};

/// What the driver's callback and the future share: the outcome once the callback ran,
/// and the waker of the task that polled last.
///
/// The callback only stores and wakes (outside the lock, so a waker that polls at once
/// finds the lock free); the future only reads, and forgets its waker when dropped.
#[derive(Default)]
pub(crate) struct Signal {
    state: Mutex<SignalState>,
}

#[derive(Default)]
struct SignalState {
    /// Set once, by [`Signal::complete`].
    outcome: Option<std::result::Result<(), DriverError>>,
    /// Whether `outcome` was set (it is taken by the poll that returns it).
    done: bool,
    waker: Option<Waker>,
}

impl Signal {
    fn lock(&self) -> MutexGuard<'_, SignalState> {
        // Nothing panics while the lock is held but a waker's `clone`; the state is a
        // plain value that stays consistent either way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores the outcome and wakes the waiting task, if any (the driver's callback).
    /// A second call changes nothing.
    pub(crate) fn complete(&self, outcome: std::result::Result<(), DriverError>) {
        let waker = {
            let mut s = self.lock();
            if s.done {
                return;
            }
            s.done = true;
            s.outcome = Some(outcome);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The outcome once the callback ran (taken: a second ready poll gets `None`), else
    /// `Pending` with `waker` kept to be woken.
    pub(crate) fn poll(&self, waker: &Waker) -> Poll<Option<std::result::Result<(), DriverError>>> {
        let mut s = self.lock();
        if s.done {
            return Poll::Ready(s.outcome.take());
        }
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
        Poll::Pending
    }

    /// Whether the callback ran.
    pub(crate) fn is_done(&self) -> bool {
        self.lock().done
    }

    /// Drops the kept waker: the future that polled is gone.
    pub(crate) fn forget_waker(&self) {
        let w = self.lock().waker.take();
        // Dropped outside the lock: a waker's drop may run the executor's code.
        drop(w);
    }
}

/// The completion of queued GPU work as a [`Future`]: `Ok(())` once the work queued on
/// a stream before [`AsStream::completion`](super::AsStream::completion) (or before an
/// event's last record, [`Event::completion`](crate::Event::completion)) is done, the
/// driver's error if that work failed, or the error that kept the completion from being
/// queued (a capturing stream, say). Woken from the driver's stream callback: no polling
/// and no runtime, so any executor can await it, beside its I/O.
///
/// Dropping it before it completes is safe: the work finishes, and what the callback
/// uses stays alive until it has run (see the [module](self) docs, which also say when
/// a future can never complete).
///
/// ```no_run
/// # async fn demo() -> cuda_rt::Result<()> {
/// use cuda_rt::prelude::*;
/// use cuda_rt::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut buf = DeviceBuffer::<f32>::empty(1 << 24)?;
/// buf.fill_async(1.0, &stream)?;
/// stream.completion().await?; // the task sleeps; the thread runs other tasks meanwhile
/// # Ok(()) }
/// ```
#[must_use = "a completion does nothing unless awaited (the work runs either way)"]
pub struct Completion {
    state: State,
}

enum State {
    /// The callback is queued; it completes the signal.
    Waiting(Arc<Signal>),
    /// Known when the future was made: nothing to wait for, or the error that kept the
    /// callback from being queued.
    Known(Result<()>),
    /// The outcome was returned.
    Taken,
}

impl Completion {
    /// A completion that is ready at once with `outcome`.
    pub(crate) fn known(outcome: Result<()>) -> Completion {
        Completion {
            state: State::Known(outcome),
        }
    }

    /// A completion the callback queued with `signal` completes.
    pub(crate) fn waiting(signal: Arc<Signal>) -> Completion {
        Completion {
            state: State::Waiting(signal),
        }
    }

    /// Whether the work is done (the driver's callback ran, or there was nothing to
    /// wait for): an `.await` would not wait. No driver call.
    pub fn is_done(&self) -> bool {
        match &self.state {
            State::Waiting(s) => s.is_done(),
            State::Known(_) | State::Taken => true,
        }
    }
}

impl Future for Completion {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let out = match &self.state {
            State::Waiting(signal) => match signal.poll(cx.waker()) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(r)) => r.map_err(Error::from),
                Poll::Ready(None) => Err(polled_again()),
            },
            State::Known(_) => match std::mem::replace(&mut self.state, State::Taken) {
                State::Known(r) => r,
                _ => Err(polled_again()),
            },
            State::Taken => Err(polled_again()),
        };
        self.state = State::Taken;
        Poll::Ready(out)
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let State::Waiting(signal) = &self.state {
            signal.forget_waker();
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting(s) if s.is_done() => "done",
            State::Waiting(_) => "pending",
            State::Known(Ok(())) => "done",
            State::Known(Err(_)) => "failed",
            State::Taken => "taken",
        };
        f.debug_struct("Completion").field("state", &state).finish()
    }
}

fn polled_again() -> Error {
    Error::invalid_state(
        StateKind::Other,
        "a Completion was polled after it returned its outcome",
    )
}

/// Refuses a completion asked for inside a host function or stream callback, where no
/// CUDA call may be made (a non-default stream would reach the driver without passing
/// through `make_current`, which refuses the others).
fn refuse_in_host_function(what: &str) -> Result<()> {
    if result::stream::in_host_function() {
        return Err(Error::invalid_state(
            StateKind::InHostFunction,
            format!(
                "{what} in a host function, stream callback or graph host node: CUDA forbids \
                 CUDA calls there; ask for the completion from another thread"
            ),
        ));
    }
    Ok(())
}

/// Queues the callback that completes a new signal on `stream`, which is not capturing.
///
/// # Safety
/// `stream` is live, or a default-stream handle, and its context is current.
unsafe fn queue_signal(stream: sys::CUstream) -> Result<Arc<Signal>> {
    let signal = Arc::new(Signal::default());
    let theirs = Arc::clone(&signal);
    // SAFETY: as the caller promises. The closure only stores and wakes (no CUDA call);
    // the driver runs it once, or drops it unrun when the call fails.
    unsafe { result::stream::add_callback(stream, move |status| theirs.complete(status)) }?;
    Ok(signal)
}

/// The error for a completion asked of a capturing stream.
fn capturing(what: &str, stream: sys::CUstream) -> Error {
    Error::capture(
        CaptureKind::Refused,
        format!(
            "{what} on stream {:#x}: the stream is capturing a graph, so its work goes into \
             the graph and runs only when the graph is launched; await the completion of \
             the stream the graph is launched on, after the launch",
            stream as usize
        ),
    )
}

/// [`AsStream::completion`](super::AsStream::completion): the stream's queued work.
///
/// # Safety
/// `stream` is live for the call (an `AsStream` keeps it so), or a default-stream handle
/// of `device`.
pub(crate) unsafe fn after_stream(stream: sys::CUstream, device: i32) -> Completion {
    let queued = (|| {
        refuse_in_host_function("AsStream::completion")?;
        if super::is_default_handle(stream as usize) {
            make_current(device)?;
        }
        // A callback is not allowed in a capture, and would be captured if it were.
        // SAFETY: the stream is live (caller).
        let status = unsafe { result::stream::is_capturing(stream) }?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(capturing("AsStream::completion", stream));
        }
        // SAFETY: live, not capturing, its context current (a non-default stream
        // carries its own).
        unsafe { queue_signal(stream) }
    })();
    match queued {
        Ok(signal) => Completion::waiting(signal),
        Err(e) => Completion::known(Err(e)),
    }
}

/// [`Event::completion`](crate::Event::completion): the work before `event`'s last
/// record, which was recorded (an event never recorded is complete without this).
///
/// Done at once when the event has completed (`cuEventQuery`, which also refuses an
/// event recorded in a capture); otherwise a stream of its own waits for the event and
/// runs the callback, so completions of events of different streams never wait for
/// each other, and the streams that recorded them never wait for a callback. The stream
/// is destroyed at once (the driver keeps it until its work is done).
///
/// # Safety
/// `event` is a live event of `device` for the call.
pub(crate) unsafe fn after_event(event: sys::CUevent, device: i32) -> Completion {
    let queued = (|| {
        refuse_in_host_function("Event::completion")?;
        make_current(device)?;
        // SAFETY: the event is live (caller); its device's context is current.
        match unsafe { result::event::query(event) } {
            Ok(true) => return Ok(None),
            Ok(false) => {}
            Err(e) => return Err(crate::error::explain_capture(e.into(), "Event::completion")),
        }
        let watcher =
            result::stream::create_with_priority(sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0, 0)?;
        // SAFETY: `watcher` was just created in the current context and is used only
        // here; the event is live (caller).
        let queued = unsafe { wait_then_signal(watcher, event) };
        // SAFETY: `watcher` is ours, destroyed once; the driver defers the destruction
        // until the wait and the callback are done.
        let _ = unsafe { result::stream::destroy(watcher) };
        queued.map(Some)
    })();
    match queued {
        Ok(Some(signal)) => Completion::waiting(signal),
        Ok(None) => Completion::known(Ok(())),
        Err(e) => Completion::known(Err(e)),
    }
}

/// Makes `watcher` wait for `event`, then queues the signal's callback on it.
///
/// # Safety
/// `watcher` is a live stream of the current context that nothing else uses; `event`
/// a live event of that context.
unsafe fn wait_then_signal(watcher: sys::CUstream, event: sys::CUevent) -> Result<Arc<Signal>> {
    // SAFETY: both live (caller).
    unsafe { result::stream::wait_event(watcher, event) }?;
    // The event was not recorded in a capture when queried above; had another thread
    // recorded it in one since, the wait would have joined the watcher to that
    // capture, where a callback may not go.
    // SAFETY: live (caller).
    let status = unsafe { result::stream::is_capturing(watcher) }?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Err(capturing("Event::completion", watcher));
    }
    // SAFETY: live, not capturing, of the current context.
    unsafe { queue_signal(watcher) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn poll(f: &mut Completion, w: &Waker) -> Poll<Result<()>> {
        Pin::new(f).poll(&mut Context::from_waker(w))
    }

    #[test]
    fn pending_until_the_callback_then_ready_once_with_one_wake() {
        let signal = Arc::new(Signal::default());
        let mut f = Completion::waiting(signal.clone());
        let (count, w) = counting();
        assert!(poll(&mut f, &w).is_pending());
        assert!(poll(&mut f, &w).is_pending(), "a second poll keeps waiting");
        assert!(!f.is_done());
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "no wake before the callback"
        );
        signal.complete(Ok(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken once");
        assert!(f.is_done());
        assert!(matches!(poll(&mut f, &w), Poll::Ready(Ok(()))));
        let again = poll(&mut f, &w);
        assert!(
            matches!(&again, Poll::Ready(Err(e)) if e.to_string().contains("polled after")),
            "{again:?}"
        );
    }

    #[test]
    fn the_last_pollers_waker_is_the_one_woken() {
        let signal = Arc::new(Signal::default());
        let mut f = Completion::waiting(signal.clone());
        let (first, w1) = counting();
        let (second, w2) = counting();
        assert!(poll(&mut f, &w1).is_pending());
        assert!(poll(&mut f, &w2).is_pending(), "moved to another task");
        signal.complete(Ok(()));
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_driver_error_is_the_outcome() {
        let signal = Arc::new(Signal::default());
        let mut f = Completion::waiting(signal.clone());
        let (_, w) = counting();
        assert!(poll(&mut f, &w).is_pending());
        let code = sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
        signal.complete(Err(DriverError::new(code, "stream callback")));
        signal.complete(Ok(()));
        match poll(&mut f, &w) {
            Poll::Ready(Err(e)) => assert_eq!(e.driver_code(), Some(code), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn completed_before_the_first_poll_is_ready_without_a_wake() {
        let signal = Arc::new(Signal::default());
        signal.complete(Ok(()));
        let mut f = Completion::waiting(signal);
        let (count, w) = counting();
        assert!(matches!(poll(&mut f, &w), Poll::Ready(Ok(()))));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_dropped_future_forgets_its_waker_and_the_callback_still_runs() {
        let signal = Arc::new(Signal::default());
        let mut f = Completion::waiting(signal.clone());
        let (count, w) = counting();
        assert!(poll(&mut f, &w).is_pending());
        drop(f);
        drop(w);
        assert_eq!(
            Arc::strong_count(&count),
            1,
            "the waker went with the future"
        );
        // The callback's reference keeps the signal: completing it is still sound.
        assert_eq!(Arc::strong_count(&signal), 1);
        signal.complete(Ok(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_known_outcome_is_ready_at_once() {
        let (_, w) = counting();
        let mut ok = Completion::known(Ok(()));
        assert!(ok.is_done());
        assert!(matches!(poll(&mut ok, &w), Poll::Ready(Ok(()))));
        let mut failed = Completion::known(Err(capturing("test", std::ptr::null_mut())));
        assert!(format!("{failed:?}").contains("failed"));
        match poll(&mut failed, &w) {
            Poll::Ready(Err(e)) => assert!(e.to_string().contains("capturing"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_callback_on_another_thread_wakes_a_blocked_waiter() {
        // A thread that parks until woken, as `futures::executor::block_on` does.
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        for _ in 0..200 {
            let signal = Arc::new(Signal::default());
            let mut f = Completion::waiting(signal.clone());
            let w = Waker::from(Arc::new(Unpark(std::thread::current())));
            let driver = std::thread::spawn(move || signal.complete(Ok(())));
            let out = loop {
                match poll(&mut f, &w) {
                    Poll::Ready(r) => break r,
                    Poll::Pending => std::thread::park(),
                }
            };
            assert!(out.is_ok());
            driver.join().unwrap();
        }
    }

    #[test]
    fn a_completion_is_send_sync_and_unpin() {
        fn check<T: Send + Sync + Unpin + 'static>() {}
        check::<Completion>();
    }
}
