package redistest_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// A test that loses its Redis server mid-way. (Examples cannot receive a
// *testing.T, so this one is compiled but not run.)
func ExampleStartServer() {
	_ = func(t *testing.T) {
		t.Parallel()
		srv := redistest.StartServer(t)
		rdb := srv.Client(t)
		key := redistest.KeyPrefix(t) + "quota"

		if err := rdb.Set(t.Context(), key, 1, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		srv.Kill(t)    // connections to srv.Addr are now refused
		srv.Restart(t) // same address, empty data
	}
}

// A test against a three-master cluster, by client or by URL. (Compiled but
// not run.)
func ExampleStartCluster() {
	_ = func(t *testing.T) {
		t.Parallel()
		cluster := redistest.StartCluster(t)
		rdb := cluster.Client(t)
		prefix := redistest.KeyPrefix(t)

		// Keys with different hash tags live on different masters.
		for _, key := range []string{"{a}x", "{b}x", "{c}x"} {
			if err := rdb.Set(t.Context(), prefix+key, 1, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}

		// Code configured by URL gets the same cluster.
		opts, err := redis.ParseClusterURL(cluster.URL())
		if err != nil {
			t.Fatal(err)
		}
		fromURL := redis.NewClusterClient(opts)
		t.Cleanup(func() { fromURL.Close() })
	}
}
