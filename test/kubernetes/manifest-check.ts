// Checks for rendered Kubernetes objects: the OpenAPI schema as kubernetes-models compiles it
// (types, required fields, formats), and a strict pass that fails on a field the schema does not
// have, which kubernetes-models lets through: every object is type-checked by TypeScript as an
// object literal of its kind's interface, where an unknown property is an error at any depth.

import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { itemAt } from '../../src/common/indexing.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const require = createRequire(import.meta.url);

export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [key: string]: unknown;
}

/** Packages with the models of custom resources the manifests use, by API group. */
const CUSTOM_RESOURCE_MODELS: Record<string, string> = { 'cert-manager.io': '@kubernetes-models/cert-manager' };

/**
 * kubernetes-models' module for a kind: `apps/v1` + `DaemonSet` → kubernetes-models/apps/v1/DaemonSet;
 * a custom resource's from its own package (`cert-manager.io/v1` + `Certificate` →
 * @kubernetes-models/cert-manager/cert-manager.io/v1/Certificate).
 */
function modelModule(object: KubeObject): string {
  const models = CUSTOM_RESOURCE_MODELS[itemAt(object.apiVersion.split('/'), 0)] ?? 'kubernetes-models';
  return `${models}/${object.apiVersion}/${object.kind}`;
}

/** Schema errors of one object (none: []), as "kind/name: message" lines. */
export function schemaErrors(object: KubeObject): string[] {
  const where = `${object.kind}/${object.metadata?.name}`;
  let Model: (new (data: unknown) => { validate(): void }) | undefined;
  try {
    Model = (require(modelModule(object)) as Record<string, typeof Model>)[object.kind];
  } catch {
    Model = undefined;
  }
  if (!Model) return [`${where}: no Kubernetes model for ${object.apiVersion} ${object.kind}`];
  try {
    new Model(unwrapSecretData(object)).validate();
    return [];
  } catch (error) {
    return [`${where}: ${(error as Error).message}`];
  }
}

/**
 * A Secret's data as the API server reads it: kustomize wraps long base64 values at 70 columns,
 * and Go's base64 decoder skips the line breaks, where kubernetes-models' "byte" check does not.
 */
function unwrapSecretData(object: KubeObject): KubeObject {
  if (object.kind !== 'Secret' || typeof object.data !== 'object' || object.data === null) return object;
  const data = Object.fromEntries(
    Object.entries(object.data as Record<string, unknown>).map(([key, value]) => [
      key,
      typeof value === 'string' ? value.replace(/[\r\n]/g, '') : value,
    ]),
  );
  return { ...object, data };
}

/**
 * Fields that no schema has, at any depth, as "kind/name: TypeScript's message" lines. All objects
 * go through one TypeScript program (about 2 s), each as a typed constant.
 */
export function unknownFieldErrors(objects: KubeObject[]): string[] {
  const file = path.join(REPO, 'test/kubernetes/__rendered-manifests__.ts');
  const lines: string[] = [];
  const owners: string[] = [];
  objects.forEach((object, i) => {
    lines.push(`import type { I${object.kind} as T${i} } from ${JSON.stringify(modelModule(object))};`);
  });
  objects.forEach((object, i) => {
    owners.push(`${object.kind}/${object.metadata?.name}`);
    lines.push(`export const o${i}: T${i} = ${JSON.stringify(object, null, 1)};`);
  });
  const source = lines.join('\n');
  const options: ts.CompilerOptions = {
    strict: true,
    noEmit: true,
    module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    target: ts.ScriptTarget.ES2022,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const readFile = host.readFile.bind(host);
  const getSourceFile = host.getSourceFile.bind(host);
  host.readFile = (name) => (path.resolve(name) === file ? source : readFile(name));
  host.fileExists = (
    (exists) => (name: string) =>
      path.resolve(name) === file || exists(name)
  )(host.fileExists.bind(host));
  host.getSourceFile = (name, version, onError) =>
    path.resolve(name) === file ? ts.createSourceFile(name, source, version) : getSourceFile(name, version, onError);
  const program = ts.createProgram([file], options, host);
  const sourceFile = program.getSourceFile(file);
  if (!sourceFile) throw new Error(`the TypeScript program did not load ${file}`);
  const errors: string[] = [];
  for (const diagnostic of [...program.getSyntacticDiagnostics(sourceFile), ...program.getSemanticDiagnostics(sourceFile)]) {
    const line = diagnostic.start === undefined ? 0 : sourceFile.getLineAndCharacterOfPosition(diagnostic.start).line;
    // The object a diagnostic belongs to: the last `export const oN` at or above its line.
    const owner = source
      .split('\n')
      .slice(0, line + 1)
      .reverse()
      .map((l) => /^export const o(\d+):/.exec(l))
      .find((match) => match !== null);
    const index = owner ? Number(itemAt(owner, 1)) : -1;
    errors.push(`${owners[index] ?? 'imports'}: ${ts.flattenDiagnosticMessageText(diagnostic.messageText, ' ')}`);
  }
  return errors;
}
