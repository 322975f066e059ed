package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server process started by startRedis for one
// top-level benchmark, on a free loopback port, without persistence.
type redisServer struct {
	Addr string
	Port int
	Pid  int
	Dir  string // its working directory
}

// startRedis starts `redis-server --port <free> --save "" --appendonly no`,
// waits until it answers PING and kills it when tb ends. It fails tb if
// redis-server is not on PATH or does not answer within 10 seconds.
func startRedis(tb testing.TB) *redisServer { return startWrapped(tb) }

// startWrapped is startRedis with redis-server run by the command wrap (a
// program and its arguments, redis-server's command line appended: valgrind,
// say); none runs it directly.
func startWrapped(tb testing.TB, wrap ...string) *redisServer {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not on PATH (these benchmarks start their own; install it, e.g. apt-get install redis-server): %v", err)
	}
	var lastErr error
	for range 5 { // another process may take the port before redis-server binds it
		port, err := freePort()
		if err != nil {
			tb.Fatalf("find a free port: %v", err)
		}
		dir := tb.TempDir()
		logPath := filepath.Join(dir, "redis.log")
		argv := append(slices.Clone(wrap), bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--protected-mode", "no",
			"--dir", dir, "--logfile", logPath)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.SysProcAttr = sysProcAttr() // dies with the test binary
		if err := cmd.Start(); err != nil {
			tb.Fatalf("start %s: %v", bin, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if err := waitPing(addr, exited); err != nil {
			stop()
			log, _ := os.ReadFile(logPath)
			lastErr = fmt.Errorf("redis-server on %s: %w\n%s", addr, err, tail(string(log), 20))
			if strings.Contains(string(log), "Address already in use") {
				continue
			}
			break
		}
		tb.Cleanup(stop)
		return &redisServer{Addr: addr, Port: port, Pid: cmd.Process.Pid, Dir: dir}
	}
	tb.Fatalf("%v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitPing polls addr with PING until it answers, the process exits or 10
// seconds pass.
func waitPing(addr string, exited <-chan error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, PoolSize: 1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("exited before answering PING: %v", werr)
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("no answer to PING within 10s: " + err.Error())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// client returns a go-redis client for the server with room for 64
// concurrent commands (so the pool is never what the 64-goroutine runs
// wait on), closed when tb ends.
func (s *redisServer) client(tb testing.TB, hooks ...redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	for _, h := range hooks {
		c.AddHook(h)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// keyPrefix returns a fresh random prefix, so no two runs share keys.
func keyPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "bench:" + hex.EncodeToString(b[:]) + ":"
}
