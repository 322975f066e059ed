package throttle

import (
	"context"
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNoRule is wrapped when a target matches no rule and there is no
	// default.
	ErrNoRule = errors.New("no rule for target")

	// ErrTooMany is wrapped when a request asks for more units than the
	// target's limit, which could never be admitted.
	ErrTooMany = errors.New("more units than the limit")

	// ErrWouldExceedDeadline is wrapped, together with
	// context.DeadlineExceeded, when the earliest slot lies past the
	// context's deadline. Nothing was reserved.
	ErrWouldExceedDeadline = errors.New("slot is past the context deadline")

	// ErrStoreUnavailable is wrapped when the store fails and the failure
	// policy waits for it (FailClosed, or FailLocal with no safe share),
	// and the context ends before it answers again.
	ErrStoreUnavailable = errors.New("store unavailable")

	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("throttle: closed")
)

// waitError wraps ctx's error with the target, so callers can still match
// context.Canceled and context.DeadlineExceeded, and the cause when the
// context was cancelled with one.
func waitError(ctx context.Context, target string) error {
	return fmt.Errorf("throttle: wait for %q: %w", target, ctxError(ctx))
}

// ctxError returns why ctx ended: its Err, which callers match
// (context.Canceled, context.DeadlineExceeded), and its cause too when it
// was given one.
func ctxError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

func deadlineError(target string, delay time.Duration) error {
	return fmt.Errorf("throttle: wait for %q: %w (slot in %v): %w", target, ErrWouldExceedDeadline, delay.Round(time.Millisecond), context.DeadlineExceeded)
}

func errorf(format string, args ...any) error {
	return fmt.Errorf("throttle: "+format, args...)
}
