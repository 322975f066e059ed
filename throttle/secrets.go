package throttle

import (
	"errors"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// passwordsOf returns the passwords in client's options. A server's error
// reply may quote them: one that does not know AUTH (renamed away, or a
// proxy) answers the connection's AUTH with "unknown command 'auth', with
// args beginning with: 'user' 'password'", and go-redis returns that text
// as the error of every call. Clients of other types, and passwords that a
// CredentialsProvider supplies, are not known.
func passwordsOf(client redis.UniversalClient) []string {
	var ps []string
	switch c := client.(type) {
	case *redis.Client:
		ps = append(ps, c.Options().Password)
	case *redis.ClusterClient:
		ps = append(ps, c.Options().Password)
	case *redis.Ring:
		ps = append(ps, c.Options().Password)
	}
	return slices.DeleteFunc(ps, func(p string) bool { return p == "" })
}

// hidePasswords returns err with every one of passwords in its text shown
// as "***", or err itself when its text holds none (nil stays nil). The
// error it returns matches with errors.Is whatever err matched, but
// errors.As does not reach err's chain, whose text holds a password.
func hidePasswords(err error, passwords []string) error {
	if err == nil || len(passwords) == 0 {
		return err
	}
	msg := err.Error()
	hidden := msg
	for _, p := range passwords {
		hidden = strings.ReplaceAll(hidden, p, "***")
	}
	if hidden == msg {
		return err
	}
	return &hiddenError{msg: hidden, err: err}
}

// hiddenError is an error whose text had a password taken out.
type hiddenError struct {
	msg string
	err error // the original, not exposed: its text holds the password
}

func (e *hiddenError) Error() string { return e.msg }

// Is reports whether the original error matches target, so that
// errors.Is(err, context.DeadlineExceeded) and the like still answer.
func (e *hiddenError) Is(target error) bool { return errors.Is(e.err, target) }
