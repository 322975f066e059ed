package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// signalError is the cause (context.Cause) of a context notifyContext
// returned, once one of its signals arrived. Its text names the signal as
// a shell does: "interrupted by SIGTERM".
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "interrupted by " + signalName(e.sig) }

// Unwrap returns context.Canceled: an interrupted run matches it, as one
// cancelled any other way does.
func (e *signalError) Unwrap() error { return context.Canceled }

// signalName returns "SIGINT" for os.Interrupt (Ctrl-C), "SIGTERM" for
// syscall.SIGTERM, and sig.String() for any other signal.
func signalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// notifyContext is signal.NotifyContext with a cause that names the signal
// (signal.NotifyContext's reads "terminated signal received"). The
// context it returns ends when the first of sigs arrives, with a
// *signalError as its cause; the process then stops catching sigs, so a
// second one takes the default action and ends it at once. stop ends the
// context, with context.Canceled as its cause if no signal came first,
// stops catching sigs and returns once the goroutine watching for them
// has returned. The caller must call stop.
func notifyContext(parent context.Context, sigs ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case sig := <-ch:
			signal.Stop(ch)
			cancel(&signalError{sig})
		case <-ctx.Done():
			signal.Stop(ch)
		}
	}()
	return ctx, func() {
		cancel(nil)
		<-done
	}
}
