#!/usr/bin/env node
// An audit log for heddle runs, written against the plugin protocol itself (JSON Lines on
// stdin/stdout, no SDK) to show that a plugin can be any program.
//
//   node audit.js --verify FILE   checks a log's hash chain and prints the number of records
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const readline = require('readline');

const sha256 = (text) => crypto.createHash('sha256').update(text).digest('hex');

// The chain's head per file: the sha256 of the last line written to it.
const heads = new Map();
const started = new Map();

function head(path) {
  if (!heads.has(path)) {
    let last = null;
    if (fs.existsSync(path)) {
      const lines = fs.readFileSync(path, 'utf8').split('\n').filter((l) => l.length > 0);
      if (lines.length > 0) last = sha256(lines[lines.length - 1]);
    }
    heads.set(path, last);
  }
  return heads.get(path);
}

function append(path, record) {
  const line = JSON.stringify({ ...record, prev: head(path) });
  fs.appendFileSync(path, line + '\n');
  heads.set(path, sha256(line));
}

function value(config, v) {
  return config.values === 'full' ? v : sha256(JSON.stringify(v === undefined ? null : v));
}

function middleware(phase, p) {
  const key = `${p.run} ${p.node.id || p.node.name}`;
  const record = { at: new Date().toISOString(), run: p.run, node: p.node.name, type: p.node.type, phase };
  if (phase === 'before') {
    started.set(key, Date.now());
    record.input = value(p.config, p.input);
  } else {
    record.output = value(p.config, p.output);
    record.branch = p.branch;
    record.ms = Date.now() - (started.get(key) || Date.now());
    started.delete(key);
  }
  append(p.config.path, record);
  return null; // an audit only watches: proceed, pass
}

function verify(path) {
  let prev = null;
  const lines = fs.readFileSync(path, 'utf8').split('\n').filter((l) => l.length > 0);
  lines.forEach((line, i) => {
    const record = JSON.parse(line);
    if (record.prev !== prev) {
      console.error(`${path}: line ${i + 1} does not follow line ${i}: the log was changed`);
      process.exit(1);
    }
    prev = sha256(line);
  });
  console.log(`${path}: ${lines.length} records, chain intact`);
}

function serve() {
  const send = (message) => process.stdout.write(JSON.stringify(message) + '\n');
  const input = readline.createInterface({ input: process.stdin, terminal: false });
  input.on('line', (line) => {
    if (!line.trim()) return;
    const { id, method, params } = JSON.parse(line);
    if (method === undefined) return; // answers to requests of ours: this plugin makes none
    try {
      if (method === 'init') send({ id, result: { protocol: 1 } });
      else if (method === 'shutdown') { send({ id, result: {} }); process.exit(0); }
      else if ((method === 'before' || method === 'after') && params.seam === 'node') {
        send({ id, result: middleware(method, params) });
      } else send({ id, error: { message: `audit: no ${method} for ${params.seam || params.component}` } });
    } catch (err) {
      console.error(err.stack || String(err));
      send({ id, error: { message: `audit: ${err.message}` } });
    }
  });
  input.on('close', () => process.exit(0));
}

if (process.argv[2] === '--verify') verify(process.argv[3]);
else serve();
