/** Bad input to `starling node-setup`: the message names the file and the problem; no file was changed. */
export class NodeSetupError extends Error {
  override name = 'NodeSetupError';
}
