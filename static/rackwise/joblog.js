// The job page's log panel: the log's last lines, then, while the job runs, the
// lines after them. It follows the polling contract of
// fleet.services.read.job_logs (the same as `rackwise logs -f`):
//
// 1. First read: ?tail=TAIL, the last lines.
// 2. Then ?offset=<the last answer's next_offset>: at once when the answer says
//    `more`, else after its poll_after_s (at least MIN_WAIT_S; slower while the
//    tab is hidden).
// 3. Stop at `eof` (the job ended and every line is shown). A job with no log
//    yet (`available` false) shows the reason and is asked again.
//
// At most KEEP lines stay on the page. Tests read [data-testid=job-log] (one
// line per text line), [data-testid=job-log-status], and the panel's
// data-next-offset and data-eof.

import { api } from "./live.js";

const TAIL = 200;
const KEEP = 2000;
const MIN_WAIT_S = 2;
const HIDDEN_WAIT_S = 15;

const pre = document.querySelector("[data-job-log]");
const statusLine = document.querySelector("[data-testid=job-log-status]");
const url = `/api/jobs/${Number(pre.dataset.jobLog)}/logs/`;
let nextOffset = null;
let lines = [];

function show(newLines) {
  if (!newLines.length) return;
  // Keep the view at the bottom if the reader was there; leave it if they scrolled up.
  const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 20;
  lines = lines.concat(newLines).slice(-KEEP);
  pre.textContent = lines.length ? lines.join("\n") + "\n" : "";
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function status(text) {
  statusLine.textContent = text;
}

function words(answer) {
  if (!answer.available) return `No log: ${answer.reason}`;
  const where = answer.source === "slurm" ? "Slurm's output file" : `the ${answer.source} cluster`;
  const kept = lines.length >= KEEP || answer.truncated ? ` (the last ${lines.length} lines; earlier ones in the API)` : "";
  const redacted = answer.redacted_lines ? " Secrets are shown as [redacted]." : "";
  if (answer.eof) return `From ${where}; the job has ended.${kept}${redacted}`;
  return `From ${where}; following while the job runs.${kept}${redacted}`;
}

async function read() {
  let answer;
  try {
    answer = await api(nextOffset === null ? `${url}?tail=${TAIL}` : `${url}?offset=${nextOffset}`);
  } catch (e) {
    status(`Could not read the log (${e.message}); trying again.`);
    setTimeout(read, 5000);
    return;
  }
  if (answer.available) {
    show(answer.lines);
    nextOffset = answer.next_offset;
  }
  pre.dataset.nextOffset = nextOffset ?? "";
  pre.dataset.eof = answer.eof ? "1" : "";
  pre.hidden = !answer.available && lines.length === 0;
  status(words(answer));
  if (answer.eof) return;
  const wait = answer.more ? 0 : Math.max(answer.poll_after_s, MIN_WAIT_S);
  setTimeout(read, (document.hidden ? Math.max(wait, HIDDEN_WAIT_S) : wait) * 1000);
}

read();
