// Preloaded with NODE_OPTIONS="--import <this file>" (Node 20 refuses --cpu-prof in NODE_OPTIONS):
// profiles the whole process with the in-process inspector and writes a .cpuprofile into
// $STARLING_CPU_PROF_DIR when the process gets SIGTERM/SIGINT or exits, whichever comes first.
// Posting to a same-thread inspector session runs synchronously, so this works in 'exit' too.

import { Session } from 'node:inspector';
import fs from 'node:fs';
import path from 'node:path';

const dir = process.env.STARLING_CPU_PROF_DIR;
if (dir) {
  const session = new Session();
  session.connect();
  session.post('Profiler.enable');
  session.post('Profiler.setSamplingInterval', { interval: 500 });
  session.post('Profiler.start');
  let written = false;
  const write = () => {
    if (written) return;
    written = true;
    session.post('Profiler.stop', (err, result) => {
      if (err) return;
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, `peer-${process.pid}-${Date.now()}.cpuprofile`), JSON.stringify(result.profile));
    });
  };
  process.on('exit', write);
  // The daemon's own SIGTERM handler (added later) still runs: listeners do not replace each other.
  process.prependListener('SIGTERM', write);
  process.prependListener('SIGINT', write);
}
