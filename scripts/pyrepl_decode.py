#!/usr/bin/env python3
"""Decode-only reference for binval's load benchmark (benches/load): read a binlog range with
python-mysql-replication and decode every row of its row events, counting them.

Prints one JSON object: {"rows": N, "events": N, "seconds": S}.
"""
import argparse
import json
import time

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", default="")
    p.add_argument("--server-id", type=int, required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--pos", type=int, required=True)
    p.add_argument("--end-file", required=True)
    p.add_argument("--end-pos", type=int, required=True)
    a = p.parse_args()
    end = (a.end_file, a.end_pos)
    stream = BinLogStreamReader(
        connection_settings={"host": a.host, "port": a.port, "user": a.user, "passwd": a.password},
        server_id=a.server_id,
        log_file=a.file,
        log_pos=a.pos,
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        # is_mariadb=True would make it start from the GTID state and ignore log_file/log_pos
        # (seen with 1.0.x on MariaDB 10.11: "pos(, 4)" in the server log): a file/pos start
        # needs the default.
    )
    rows = events = 0
    t0 = time.monotonic()
    for ev in stream:
        events += 1
        for _ in ev.rows:  # decodes every value of the row images
            rows += 1
        if (stream.log_file, stream.log_pos) >= end:
            break
    secs = time.monotonic() - t0
    stream.close()
    print(json.dumps({"rows": rows, "events": events, "seconds": secs}))


if __name__ == "__main__":
    main()
