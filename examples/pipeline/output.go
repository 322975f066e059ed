package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// output is one CSV file the job writes, -out or -rejects: checked when
// the run starts, before any API call, and written when it ends. A regular
// file is written under a temporary name beside it and renamed over it
// only once complete, so a run that fails or is interrupted leaves an
// earlier file as it was.
type output struct {
	flag string   // "-out" or "-rejects", for messages
	path string   // the file to write; "" for stdout
	f    *os.File // the temporary file, or the file itself when it is not regular (a device or a FIFO); nil for stdout
	tmp  bool     // f is a temporary file, renamed over path by commit
}

// openOutput checks that the file path of flag can be written, and
// returns it to be written by commit; path "" or "-" is stdout. When path
// is a regular file or does not exist yet, it creates the temporary file
// beside it (with path's permissions when it exists, those os.Create gives
// otherwise), so that a directory that is missing or read-only is found
// now; a symbolic link is followed. When path is not a regular file it
// opens it for writing, without truncating it. A path that is a directory
// is an error. Every error starts with flag.
func openOutput(flag, path string) (*output, error) {
	if path == "" || path == "-" {
		return &output{flag: flag}, nil
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	o := &output{flag: flag, path: path}
	fi, err := os.Stat(path)
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", flag, err)
	case err == nil && fi.IsDir():
		return nil, fmt.Errorf("%s: %s is a directory, want a file", flag, path)
	case err == nil && !fi.Mode().IsRegular():
		if o.f, err = os.OpenFile(path, os.O_WRONLY, 0); err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		return o, nil
	}
	if o.f, err = createBeside(path); err != nil {
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = pe.Err // it names the temporary file
		}
		return nil, fmt.Errorf("%s: create %s: %w", flag, path, err)
	}
	o.tmp = true
	if fi != nil {
		if err := o.f.Chmod(fi.Mode().Perm()); err != nil {
			o.discard()
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
	}
	return o, nil
}

// createBeside creates a new file in path's directory, named after path,
// with os.Create's permissions.
func createBeside(path string) (*os.File, error) {
	dir, base := filepath.Split(path)
	for {
		name := filepath.Join(dir, fmt.Sprintf(".%s.%08x.tmp", base, rand.Uint32()))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
}

// commit writes header and records as CSV to o, to stdout when o is
// stdout, and closes it. On error the file at o.path is left as it was,
// unless it is not a regular file, and the temporary file is removed.
func (o *output) commit(stdout io.Writer, header []string, records [][]string) error {
	if o.f == nil {
		if err := writeRecords(stdout, header, records); err != nil {
			return fmt.Errorf("%s: write stdout: %w", o.flag, err)
		}
		return nil
	}
	f := o.f
	o.f = nil
	err := writeRecords(f, header, records)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && o.tmp {
		err = os.Rename(f.Name(), o.path)
	}
	if err != nil {
		if o.tmp {
			os.Remove(f.Name())
		}
		return fmt.Errorf("%s: write %s: %w", o.flag, o.path, err)
	}
	return nil
}

// discard closes o and removes its temporary file, if commit did not
// rename it. It does nothing on a nil o, or after commit.
func (o *output) discard() {
	if o == nil || o.f == nil {
		return
	}
	o.f.Close()
	if o.tmp {
		os.Remove(o.f.Name())
	}
	o.f = nil
}
