package stageconn

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

// BenchmarkConditioningTransport measures the async-chunk transport between
// a Thinker worker and its Talkers: streams requests decode in lockstep,
// one row each per step (a batched decode step every 10 ms), and each
// stream's reader takes every row as soon as it can — the worst case for
// the transport, since a Talker slower than the Thinker asks for rows in
// batches. Rows are Qwen3-Omni's width (2048 embed + 2048 hidden float32,
// 16 KiB). Per row it reports the process's CPU time (user + system: the
// writer, the HTTP server and the readers, all in this process) and the
// HTTP requests made.
//
// Two transports: longpoll is what the workers speak (GET ?from=N, answered
// once a row is at N or after the read wait); push is the alternative, one
// streamed response per stash that writes and flushes each row as it is
// appended, built here only to compare. Run with
//
//	go test ./reference/stageconn -run '^$' -bench ConditioningTransport -benchtime 200x
//
// With reader=talker each reader instead takes one row per 16 ms, asking
// for more only once it has used what it holds, as the Talker does (one
// row per frame; reference/engine/talker/feed.go): behind the Thinker, each long
// poll brings every row made since the last.
func BenchmarkConditioningTransport(b *testing.B) {
	for _, reader := range []string{"eager", "talker"} {
		for _, transport := range []string{"longpoll", "push"} {
			for _, streams := range []int{1, 8, 64} {
				if reader == "talker" && transport == "push" {
					continue // push sends every row as made, whatever the reader's pace
				}
				b.Run(fmt.Sprintf("reader=%s/%s/streams=%d", reader, transport, streams), func(b *testing.B) {
					pace := time.Duration(0)
					if reader == "talker" {
						pace = 16 * time.Millisecond
					}
					benchTransport(b, transport, streams, 2048, 10*time.Millisecond, pace)
				})
			}
		}
	}
}

func benchTransport(b *testing.B, transport string, streams, width int, step, pace time.Duration) {
	s := NewStore(Config{})
	mux := http.NewServeMux()
	mux.Handle(stageapi.ConditioningPath+"{key}", s.Handler())
	mux.HandleFunc("/push/{key}", func(w http.ResponseWriter, r *http.Request) { servePush(w, r, s) })
	hs := httptest.NewServer(mux)
	defer hs.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}

	row := make([]float32, width)
	for i := range row {
		row[i] = float32(i) / float32(width)
	}
	keys := make([]string, streams)
	for i := range keys {
		keys[i] = "req-" + strconv.Itoa(i)
		if err := s.Open(keys[i], &stageapi.Conditioning{TTSPad: row[:8], TTSBos: row[:8], TTSEos: row[:8]}); err != nil {
			b.Fatal(err)
		}
	}
	var requests sync.WaitGroup
	counts := make([]int, streams)
	errs := make(chan error, streams)
	for i, key := range keys {
		requests.Go(func() {
			n, reqs, err := readStream(client, hs.URL, key, transport, pace)
			if err == nil && n != b.N {
				err = fmt.Errorf("%s: read %d rows; want %d", key, n, b.N)
			}
			counts[i] = reqs
			if err != nil {
				errs <- err
			}
		})
	}

	cpu0 := cpuTime()
	b.ResetTimer()
	tick := time.NewTicker(step)
	defer tick.Stop()
	for range b.N {
		<-tick.C
		for _, key := range keys {
			if err := s.Append(key, [][]float32{row}, [][]float32{row}, []int{1}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, key := range keys {
		_ = s.Close(key)
	}
	requests.Wait()
	b.StopTimer()
	cpu := cpuTime() - cpu0
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	rows := float64(b.N * streams)
	b.ReportMetric(float64(cpu.Microseconds())/rows, "cpu-µs/row")
	b.ReportMetric(float64(total)/rows, "requests/row")
	b.ReportMetric(0, "ns/op") // paced: wall time is the step interval, not a cost
}

// readStream reads key to its end over transport and returns the rows and
// the HTTP requests it took. A reader with a pace uses one row per pace
// and asks for more only when it has used them all.
func readStream(client *http.Client, base, key, transport string, pace time.Duration) (rows, requests int, err error) {
	ctx := context.Background()
	if transport == "longpoll" {
		for {
			st, info, err := FetchFrom(ctx, client, base, key, "", rows)
			requests++
			if err != nil {
				return rows, requests, err
			}
			rows += len(st.Embed)
			if info.Done {
				return rows, requests, nil
			}
			if pace > 0 {
				time.Sleep(time.Duration(len(st.Embed)) * pace)
			}
		}
	}
	resp, err := client.Get(base + "/push/" + key)
	if err != nil {
		return 0, 1, err
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		var n uint32
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			if err == io.EOF {
				return rows, 1, nil
			}
			return rows, 1, err
		}
		frame := make([]byte, n)
		if _, err := io.ReadFull(r, frame); err != nil {
			return rows, 1, err
		}
		st, err := stageapi.DecodeConditioning(frame)
		if err != nil {
			return rows, 1, err
		}
		rows += len(st.Embed)
	}
}

// servePush streams a stash's rows as they are appended: each batch of new
// rows as one length-prefixed frame in the wire form, flushed at once.
func servePush(w http.ResponseWriter, r *http.Request, s *Store) {
	key := r.PathValue("key")
	flusher := http.NewResponseController(w)
	from := 0
	for {
		st, done, err := s.Read(r.Context(), key, from)
		if err != nil {
			return
		}
		frame, err := stageapi.EncodeConditioning(st)
		if err != nil {
			return
		}
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(frame)))
		if _, err := w.Write(n[:]); err != nil {
			return
		}
		if _, err := w.Write(frame); err != nil {
			return
		}
		_ = flusher.Flush()
		from += len(st.Embed)
		if done {
			return
		}
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
