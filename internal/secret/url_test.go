package secret

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestURLError(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://:s3cr%zz3t@host/0": "a '%' not followed by two hexadecimal digits",
		"redis://u:s3cr/3t@host/0":  "a port that is not a number",
		"http://a b.com/":           "a character a host name cannot hold",
		"http://a.com/\x01":         "a control character",
		"http://[::1/":              "unbalanced brackets in the host",
		"http://us er:pw@h/":        "a character a user or password cannot hold before the '@'",
		":foo":                      "no scheme: want redis:// or rediss://",
	} {
		_, err := url.Parse(raw)
		require.Error(t, err, raw)
		got := URLError(err, "redis:// or rediss://")
		require.Equal(t, want, got, raw)
		require.NotContains(t, got, "s3cr", raw)
	}
}

func TestRedacted(t *testing.T) {
	for raw, want := range map[string]string{
		"https://alice:s3cret@example.com/x": "https://alice:xxxxx@example.com/x",
		"https://S3CRETTOKEN@example.com/x":  "https://xxxxx@example.com/x",
		"https://S3CRETTOKEN:@example.com/x": "https://xxxxx@example.com/x", // curl -u TOKEN:
		"https://:s3cret@example.com/x":      "https://:xxxxx@example.com/x",
		"https://example.com/x?q=1":          "https://example.com/x?q=1",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err, raw)
		require.Equal(t, want, Redacted(u), raw)
	}
	require.Empty(t, Redacted(nil))
}
