package secret

import (
	"errors"
	"net/url"
	"strings"
)

// URLError says what made url.Parse fail, in words that quote nothing of
// the URL: the part that failed may be a password that did not parse
// ("http://user:pass/word@host" fails on the port "pass", and a bad escape
// in a password is quoted by url.Parse). schemes names the schemes the
// caller takes, for a URL without one ("http:// or https://").
func URLError(err error, schemes string) string {
	var esc url.EscapeError
	var host url.InvalidHostError
	msg := err.Error()
	switch {
	case errors.As(err, &esc):
		return "a '%' not followed by two hexadecimal digits"
	case errors.As(err, &host):
		return "a character a host name cannot hold"
	case strings.Contains(msg, "invalid control character"):
		return "a control character"
	case strings.Contains(msg, "invalid port"):
		return "a port that is not a number"
	case strings.Contains(msg, "invalid userinfo"):
		return "a character a user or password cannot hold before the '@'"
	case strings.Contains(msg, "missing ']'") || strings.Contains(msg, "unexpected '['"):
		return "unbalanced brackets in the host"
	case strings.Contains(msg, "missing protocol scheme"), strings.Contains(msg, "first path segment"):
		return "no scheme: want " + schemes
	}
	return "it does not parse"
}

// Redacted returns u as url.URL.Redacted does, its password shown as
// "xxxxx", and its user too when it has no password or an empty one: such
// a user is most often a token ("https://TOKEN@api.example.com/", or
// "https://TOKEN:@..." as curl -u TOKEN: writes it, sent as Basic auth),
// which Redacted would show.
func Redacted(u *url.URL) string {
	if u == nil || u.User == nil {
		return u.Redacted()
	}
	if pw, ok := u.User.Password(); ok && pw != "" {
		return u.Redacted()
	}
	c := *u
	c.User = url.User("xxxxx")
	return c.String()
}
