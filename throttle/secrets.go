package throttle

import (
	"errors"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/secret"
)

// passwordsOf returns the passwords in client's options. A server's error
// reply may quote them: one that does not know AUTH (renamed away, or a
// proxy) answers the connection's AUTH with "unknown command 'auth', with
// args beginning with: 'user' 'password'", and go-redis returns that text
// as the error of every call. Clients of other types, a Sentinel's
// password (not in the options of a client NewFailoverClient made), and
// passwords that a CredentialsProvider supplies are not known: such an
// echo is cut whatever the passwords (secret.Hide), so none of them shows
// there either.
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

// hidePasswords returns err with passwords taken out of its text (see
// secret.Hide), or err itself when its text holds none of them (nil stays
// nil). The error it returns matches with errors.Is whatever err matched,
// and with errors.As a redis.Error, as its text, when err has one
// (redis.HasErrorPrefix still reads it); other errors of err's chain,
// whose text may hold a password, are not reached.
func hidePasswords(err error, passwords []string) error {
	if err == nil {
		return err
	}
	msg := err.Error()
	hidden := secret.Hide(msg, passwords)
	if hidden == msg {
		return err
	}
	return &hiddenError{msg: hidden, err: err, passwords: passwords}
}

// hiddenError is an error whose text had a password taken out.
type hiddenError struct {
	msg       string
	err       error // the original, not exposed: its text holds the password
	passwords []string
}

func (e *hiddenError) Error() string { return e.msg }

// Is reports whether the original error matches target, so that
// errors.Is(err, context.DeadlineExceeded) and the like still answer.
func (e *hiddenError) Is(target error) bool { return errors.Is(e.err, target) }

// As sets a *redis.Error target to the original's redis.Error with its
// text hidden too.
func (e *hiddenError) As(target any) bool {
	p, ok := target.(*redis.Error)
	if !ok {
		return false
	}
	var re redis.Error
	if !errors.As(e.err, &re) {
		return false
	}
	*p = hiddenRedisError(secret.Hide(re.Error(), e.passwords))
	return true
}

// hiddenRedisError is a redis.Error with a password taken out of its text.
type hiddenRedisError string

func (e hiddenRedisError) Error() string { return string(e) }

// RedisError marks it as a redis.Error.
func (hiddenRedisError) RedisError() {}
