//! The library's request queue (`moelite_queue_*`): many generation requests decoded together by
//! one context's sequences (continuous batching), each getting exactly what the library's
//! generation gives it alone.
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::context::Context;
use crate::error::{c_count, check, Result, Status};
use crate::generate::{GenerateParams, StopReason};
use moelite_sys as sys;

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    /// Not yet admitted into a sequence.
    Waiting,
    Running,
    Finished(StopReason),
}

impl RequestState {
    fn from_raw(v: i32) -> RequestState {
        match v {
            sys::MOELITE_REQUEST_WAITING => RequestState::Waiting,
            sys::MOELITE_REQUEST_RUNNING => RequestState::Running,
            _ => RequestState::Finished(StopReason::from_raw(v)),
        }
    }
}

/// What one step did to one request: the token it generated, if any, and its state after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEvent {
    pub request: i64,
    pub token: Option<i32>,
    pub state: RequestState,
}

/// A queue over a context it borrows mutably for its whole life, so nothing else evaluates the
/// context meanwhile (the library's rule) and the context outlives it. `Send`, used by one thread
/// at a time, as the context.
pub struct Queue<'c> {
    ptr: NonNull<sys::moelite_queue>,
    _ctx: PhantomData<&'c mut Context>,
}

unsafe impl Send for Queue<'_> {}

impl Drop for Queue<'_> {
    fn drop(&mut self) {
        unsafe { sys::moelite_queue_free(self.ptr.as_ptr()) }
    }
}

impl<'c> Queue<'c> {
    /// Up to `ctx.n_seq()` requests run at once; a request is admitted into the free sequence whose
    /// cached tokens share the longest prefix with its prompt.
    pub fn new(ctx: &'c mut Context) -> Result<Queue<'c>> {
        let mut out: *mut sys::moelite_queue = std::ptr::null_mut();
        check(unsafe { sys::moelite_queue_create(ctx.as_ptr(), &mut out) })?;
        Ok(Queue { ptr: NonNull::new(out).expect("moelite_queue_create returned OK and no queue"), _ctx: PhantomData })
    }

    /// Queues `prompt` (token ids, taken as given) with `params` (copied); returns its id.
    pub fn add(&mut self, prompt: &[i32], params: &GenerateParams) -> Result<i64> {
        let n = c_count("prompt", prompt.len())?;
        let raw = params.build()?;
        let mut id = -1i64;
        check(unsafe { sys::moelite_queue_add(self.ptr.as_ptr(), prompt.as_ptr(), n, raw.0.as_ptr(), &mut id) })?;
        Ok(id)
    }

    /// One step: admits, evaluates the running requests together and samples them. A failed
    /// step changed nothing; the next one tries again.
    pub fn step(&mut self) -> Result<Vec<QueueEvent>> {
        let mut n = 0i32;
        check(unsafe { sys::moelite_queue_step(self.ptr.as_ptr(), &mut n) })?;
        let mut events = Vec::with_capacity(n.max(0) as usize);
        for i in 0..n {
            let (mut request, mut token, mut state) = (-1i64, -1i32, 0i32);
            check(unsafe { sys::moelite_queue_event(self.ptr.as_ptr(), i, &mut request, &mut token, &mut state) })?;
            events.push(QueueEvent {
                request,
                token: if token >= 0 { Some(token) } else { None },
                state: RequestState::from_raw(state),
            });
        }
        Ok(events)
    }

    /// Steps until no request waits or runs; returns every event.
    pub fn run(&mut self) -> Result<Vec<QueueEvent>> {
        let mut all = Vec::new();
        while self.waiting() + self.running() > 0 {
            all.extend(self.step()?);
        }
        Ok(all)
    }

    pub fn waiting(&self) -> i64 {
        unsafe { sys::moelite_queue_waiting(self.ptr.as_ptr()) }
    }
    pub fn running(&self) -> i64 {
        unsafe { sys::moelite_queue_running(self.ptr.as_ptr()) }
    }
    /// Finished requests not yet removed.
    pub fn finished(&self) -> i64 {
        unsafe { sys::moelite_queue_finished(self.ptr.as_ptr()) }
    }

    pub fn state(&self, id: i64) -> Result<RequestState> {
        let mut state = 0i32;
        check(unsafe { sys::moelite_queue_request_state(self.ptr.as_ptr(), id, &mut state) })?;
        Ok(RequestState::from_raw(state))
    }

    /// The tokens the request generated so far (an end token is not one of them).
    pub fn tokens(&self, id: i64) -> Result<Vec<i32>> {
        let mut n = 0i32;
        let st = unsafe { sys::moelite_queue_request_tokens(self.ptr.as_ptr(), id, std::ptr::null_mut(), 0, &mut n) };
        if st != Status::BUFFER_TOO_SMALL.0 {
            check(st)?;
        }
        let mut out = vec![0i32; n.max(0) as usize];
        check(unsafe { sys::moelite_queue_request_tokens(self.ptr.as_ptr(), id, out.as_mut_ptr(), n, &mut n) })?;
        out.truncate(n.max(0) as usize);
        Ok(out)
    }

    /// The text the request emitted so far (stop strings cut, characters whole).
    pub fn text(&self, id: i64) -> Result<String> {
        let mut len = 0usize;
        let st = unsafe { sys::moelite_queue_request_text(self.ptr.as_ptr(), id, std::ptr::null_mut(), 0, &mut len) };
        if st != Status::BUFFER_TOO_SMALL.0 {
            check(st)?;
        }
        let mut buf = vec![0u8; len];
        check(unsafe {
            sys::moelite_queue_request_text(self.ptr.as_ptr(), id, buf.as_mut_ptr() as *mut _, buf.len(), &mut len)
        })?;
        buf.truncate(len);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Ends a waiting or running request at once (`StopReason::Aborted`), freeing its sequence.
    pub fn cancel(&mut self, id: i64) -> Result<()> {
        check(unsafe { sys::moelite_queue_cancel(self.ptr.as_ptr(), id) })
    }

    /// Cancels the request if it has not finished and forgets it.
    pub fn remove(&mut self, id: i64) -> Result<()> {
        check(unsafe { sys::moelite_queue_remove(self.ptr.as_ptr(), id) })
    }
}
