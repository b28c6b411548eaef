/**
 * How often a download tells the scheduler its running total of bytes received while pieces
 * arrive (the Received packet). Pieces are judged when they end, and 4 MiB on a 3 Mbit/s link
 * takes 11 s, meanwhile every peer below a slow node in a chain waits on it; with a total every
 * half second the scheduler sees a slow download within a couple of reports. Two small packets a
 * second per download are nothing beside the pieces' own reports on a fast link.
 */
export const RECEIVED_REPORT_INTERVAL_MS = 500;
