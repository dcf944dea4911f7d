// A pg_tide external worker in Go (lib/pq): see examples/README.md.
//
// Built with Debian's lib/pq, without Go modules (they cannot be downloaded here):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o worker .
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lib/pq"
)

// A business error: retrying cannot help, the run goes to the dead letters.
type businessError struct{ msg string }

func (e businessError) Error() string { return e.msg }

type run struct {
	id, token int64
	attempt   int
	key       string
	payload   struct {
		N      int64 `json:"n"`
		Flaky  bool  `json:"flaky"`
		SlowMs int   `json:"slow_ms"`
	}
}

// work does what the payload asks for and returns n squared.
func work(ctx context.Context, db *sql.DB, r *run) (int64, error) {
	if r.payload.N < 0 {
		return 0, businessError{fmt.Sprintf("n must not be negative, got %d", r.payload.N)}
	}
	if r.payload.Flaky && r.attempt == 1 {
		return 0, errors.New("flaky: fails its first attempt")
	}
	for done := 250; done <= r.payload.SlowMs; done += 250 {
		time.Sleep(250 * time.Millisecond)
		// Keeps the lease and records progress (the run's checkpoint).
		progress := fmt.Sprintf(`{"done_ms": %d}`, done)
		if _, err := db.ExecContext(ctx, "SELECT tide.heartbeat_run($1, $2, $3::jsonb)", r.id, r.token, progress); err != nil {
			return 0, err
		}
	}
	return r.payload.N * r.payload.N, nil
}

func runOne(ctx context.Context, db *sql.DB, worker string, r *run) error {
	square, err := work(ctx, db, r)
	if err != nil {
		kind := "transient"
		var b businessError
		if errors.As(err, &b) {
			kind = "business"
		}
		_, err = db.ExecContext(ctx, "SELECT tide.fail_run($1, $2, $3, $4)", r.id, r.token, err.Error(), kind)
		return err
	}
	// The result and the completion commit together: a stale lease token rolls both back.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO example_result (key, n, square, worker) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING",
		r.key, r.payload.N, square, worker); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "SELECT tide.complete_run($1, $2)", r.id, r.token); err != nil {
		return err
	}
	return tx.Commit()
}

func claim(ctx context.Context, db *sql.DB, queue, worker string) ([]*run, error) {
	rows, err := db.QueryContext(ctx,
		"SELECT run_id, lease_token, attempt, coalesce(dedupe_key, ''), coalesce(payload, '{}')"+
			" FROM tide.claim_runs($1, $2, n => 10, lease => interval '30 seconds')", queue, worker)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var runs []*run
	for rows.Next() {
		r := &run{}
		var payload []byte
		if err := rows.Scan(&r.id, &r.token, &r.attempt, &r.key, &payload); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(payload, &r.payload); err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, rows.Err()
}

func main() {
	url := os.Getenv("DATABASE_URL")
	queue := os.Getenv("QUEUE")
	if queue == "" {
		queue = "default"
	}
	host, _ := os.Hostname()
	worker := fmt.Sprintf("go-%s-%d", host, os.Getpid())

	// SIGTERM or Ctrl-C: stop claiming; the run in hand is finished (its context stays live).
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	ctx := context.Background()

	db, err := sql.Open("postgres", url)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// Fails at once on a wrong URL (the listener below would retry it quietly).
	if err := db.PingContext(ctx); err != nil {
		log.Fatal(err)
	}
	listener := pq.NewListener(url, time.Second, time.Minute, nil)
	defer listener.Close()
	if err := listener.Listen("pg_tide_ready"); err != nil {
		log.Fatal(err)
	}
	log.Printf("%s: claiming from queue %s", worker, queue)
	for {
		select {
		case <-stop:
			log.Printf("%s: stopped", worker)
			return
		default:
		}
		runs, err := claim(ctx, db, queue, worker)
		if err != nil {
			log.Fatal(err)
		}
		for _, r := range runs {
			if err := runOne(ctx, db, worker, r); err != nil {
				log.Printf("run %d: %v", r.id, err)
			}
			if len(stop) > 0 {
				break
			}
		}
		if len(runs) == 0 {
			// Wake on a notification, or after 2 seconds (one can be missed).
			select {
			case <-listener.Notify:
			case <-time.After(2 * time.Second):
			case s := <-stop:
				stop <- s
			}
		}
	}
}
