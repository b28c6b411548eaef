import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatBitRate, parseBitRate, parseRate, parseSize } from '../../src/common/units.js';

describe('units: one reading of sizes and rates for the peer, the benchmarks and the simulator', () => {
  it('reads sizes to the nearest byte', () => {
    assert.equal(parseSize('4MiB'), 4 * 2 ** 20);
    assert.equal(parseSize('21.4GB'), 21.4e9);
    assert.equal(parseSize('4.1MB'), 4_100_000); // 4.1 × 10^6 is 4099999.9999999995 in floating point
    assert.equal(parseSize('1000000'), 1e6);
    assert.throws(() => parseSize('4 parsecs'), /invalid size "4 parsecs"/);
  });

  it('reads a rate in bytes per second for settings, where a bare number is bytes and 0 is unlimited', () => {
    assert.equal(parseRate('800Mbit'), 100e6);
    assert.equal(parseRate('12.5MB/s'), 12.5e6);
    assert.equal(parseRate('1MiB/s'), 2 ** 20);
    assert.equal(parseRate('1048576'), 2 ** 20);
    assert.equal(parseRate('0'), 0);
    assert.equal(parseRate(5), 5);
  });

  it("reads a link's rate in bits per second as tc does, where a bare number is bits", () => {
    assert.equal(parseBitRate('25mbit'), 25e6);
    assert.equal(parseBitRate('50gbit'), 50e9);
    assert.equal(parseBitRate('500kbit'), 500e3);
    assert.equal(parseBitRate('1mibit'), 2 ** 20);
    assert.equal(parseBitRate('12.5MB/s'), 100e6);
    assert.equal(parseBitRate('1000'), 1000);
    assert.equal(parseBitRate(8e6), 8e6);
  });

  it('reads the same text as the same rate in either unit', () => {
    for (const text of ['25mbit', '1gbit', '400mbit', '12.5MB/s', '3MiB/s']) assert.equal(parseRate(text) * 8, parseBitRate(text), text);
  });

  it('refuses a link of no rate, an unknown unit, and "mbps" (megabytes to tc, megabits to most)', () => {
    assert.throws(() => parseBitRate('0'), /a link's rate must be positive, got "0"/);
    assert.throws(() => parseBitRate(-1), /must be positive/);
    assert.throws(() => parseBitRate('25 furlongs'), /invalid rate "25 furlongs"/);
    assert.throws(() => parseBitRate('3mbps'), /invalid rate "3mbps"/);
    assert.throws(() => parseRate('3mbps'), /invalid rate "3mbps"/);
  });

  it('writes a bit rate back as tc reads it', () => {
    for (const rate of ['50gbit', '25mbit', '500kbit', '2.5gbit']) assert.equal(formatBitRate(parseBitRate(rate)), rate);
    assert.equal(formatBitRate(1.5e6), '1.5mbit');
  });
});
