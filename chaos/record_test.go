package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// mono reads CLOCK_MONOTONIC: one clock for every process on the machine,
// so that the histories of all workers can be ordered against each other
// (Go's own monotonic readings are relative to each process's start).
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // Linux always has it
	}
	return ts.Nano()
}

// Event kinds.
const (
	evCall  = "call"  // an operation starts
	evRet   = "ret"   // it returned, with its result
	evTrust = "trust" // a holder checked, over [T, To], that it held Name/Tok
	evNote  = "note"  // free text, for the report
	evLeak  = "leak"  // a worker's goroutines did not come back to baseline
)

// Operation names and results.
const (
	opAcquire = "acquire"
	opRelease = "release"
	opWrite   = "write" // a guarded write of Val (and a counter increment)
	opRead    = "read"  // a read of the protected value

	resOK      = "ok"      // done: acquired (Tok), released, write committed, read Val
	resBusy    = "busy"    // not done: held by another
	resRefused = "refused" // not done: the guard refused the token
	resNotHeld = "notheld" // not done: release of a lease not held
	resUnknown = "unknown" // the request may or may not have run
)

// event is one line of a worker's history file.
type event struct {
	K    string `json:"k"`
	P    int    `json:"p"`           // worker (process) number
	I    int64  `json:"i,omitempty"` // operation id, unique per worker
	Op   string `json:"op,omitempty"`
	Name string `json:"n,omitempty"`
	Tok  int64  `json:"tok,omitempty"`
	Val  int64  `json:"v,omitempty"`
	Res  string `json:"r,omitempty"`
	T    int64  `json:"t"`            // CLOCK_MONOTONIC, ns
	To   int64  `json:"to,omitempty"` // end of a trust interval
	Text string `json:"x,omitempty"`
}

// recorder appends events to a file with one write per event, unbuffered,
// so that a SIGKILL loses nothing that was recorded.
type recorder struct {
	mu sync.Mutex
	f  *os.File
	p  int
	n  int64
}

func newRecorder(path string, p int) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f, p: p}, nil
}

func (r *recorder) write(e event) {
	e.P = r.p
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		panic(fmt.Sprintf("chaos: record: %v", err))
	}
}

// call records the start of an operation and returns its id.
func (r *recorder) call(op, name string, tok, val int64) int64 {
	r.mu.Lock()
	r.n++
	id := r.n
	r.mu.Unlock()
	r.write(event{K: evCall, I: id, Op: op, Name: name, Tok: tok, Val: val, T: mono()})
	return id
}

// acqID names one acquisition by client c of this worker: unique in a run.
func (r *recorder) acqID(c, n int64) int64 { return int64(r.p)<<40 | c<<32 | n }

// ret records the result of operation id.
func (r *recorder) ret(id int64, res string, tok, val int64) {
	r.write(event{K: evRet, I: id, Res: res, Tok: tok, Val: val, T: mono()})
}

// trust runs check, a holder's reading of whether it still holds name's
// acquisition tok, and records the reading's interval when it says yes.
func (r *recorder) trust(name string, tok int64, check func() bool) bool {
	before := mono()
	ok := check()
	after := mono()
	if ok {
		r.write(event{K: evTrust, Name: name, Tok: tok, T: before, To: after})
	}
	return ok
}

func (r *recorder) note(format string, args ...any) {
	r.write(event{K: evNote, T: mono(), Text: fmt.Sprintf(format, args...)})
}

// readEvents reads a history file; a torn last line (SIGKILL mid-write
// cannot tear a single write(2) of a line, but be tolerant) is skipped.
func readEvents(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}
