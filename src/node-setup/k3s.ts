// k3s and RKE2 run their own containerd and render its config.toml from a Go template at every
// start (config.toml.tmpl, or config-v3.toml.tmpl for containerd 2.x): the template is what
// lasts, so node-setup edits the template and restarts the k3s or RKE2 service to render it.
//
// Two kinds of template are edited: plain TOML (a copy of the rendered config, which node-setup
// makes when there is no template), and the form k3s documents, `{{ template "base" . }}` followed
// by TOML appended to the config k3s would write by itself. TOML never lets a table be defined
// twice, so after the base only tables the base lacks can be added (the snapshotter's proxy
// plugin can, a snapshotter the base already names cannot): such an edit is refused, with why.

import { dirname, join } from 'node:path';
import { planContainerdConfig, type ContainerdConfigOptions, type ContainerdConfigPlan } from './containerd-config.js';
import { NodeSetupError } from './errors.js';
import { readIfExists } from './journal.js';
import { parseToml, valueAt } from './toml-text.js';

export type K3sFlavour = 'k3s' | 'rke2';

const K3S_CONFIG = /\/rancher\/(k3s|rke2)\/agent\/etc\/containerd\/config\.toml$/;

/** k3s's base template, as its documentation writes it (Go's trim markers allowed). */
const BASE_TEMPLATE = /^\{\{-?\s*template\s+"base"\s+\.\s*(-?)\}\}/;

/** The systemd units that run each flavour's containerd: a server node runs the first, an agent node the second. */
export const K3S_UNITS: Record<K3sFlavour, readonly [string, string]> = {
  k3s: ['k3s', 'k3s-agent'],
  rke2: ['rke2-server', 'rke2-agent'],
};

/** Whether `configFile` is the config.toml k3s or RKE2 renders, and which. */
export function k3sFlavour(configFile: string | undefined): K3sFlavour | undefined {
  return configFile ? (K3S_CONFIG.exec(configFile)?.[1] as K3sFlavour | undefined) : undefined;
}

/** The file to edit for a k3s or RKE2 node, and the edit. */
export interface TemplatePlan {
  path: string;
  plan: ContainerdConfigPlan;
}

/**
 * Plans the edit of the template `configFile` is rendered from (created from the rendered file
 * when absent). The plan's text is the template's new text.
 */
export async function planK3sTemplate(configFile: string, flavour: K3sFlavour, options: ContainerdConfigOptions): Promise<TemplatePlan> {
  const rendered = await readIfExists(configFile);
  const v3 = /^\s*version\s*=\s*3\b/m.test(rendered ?? '') || (rendered === undefined && options.newConfigVersion === 3);
  const template = join(dirname(configFile), v3 ? 'config-v3.toml.tmpl' : 'config.toml.tmpl');
  const templateText = await readIfExists(template);
  if (templateText === undefined) return { path: template, plan: planContainerdConfig(rendered, template, options) };
  const base = BASE_TEMPLATE.exec(templateText);
  const tail = base ? templateText.slice(base[0].length) : templateText;
  if (tail.includes('{{')) {
    throw new NodeSetupError(
      `${template} is a Go template (it holds "{{"${base ? ' after {{ template "base" . }}' : ''}): node-setup edits plain TOML, or plain TOML after {{ template "base" . }}; add the settings by hand`,
    );
  }
  if (!base) return { path: template, plan: planContainerdConfig(templateText, template, options) };
  // Go drops the whitespace that follows a `-}}`.
  const renderedTail = base[1] ? tail.replace(/^\s+/, '') : tail;
  return { path: template, plan: planAfterBase(configFile, rendered, template, templateText, renderedTail, flavour, options) };
}

/**
 * The edit of a `{{ template "base" . }}` template: `rendered` is the base's output followed by
 * `tail`, so the plan is made on the rendered config with everything before the tail locked.
 */
function planAfterBase(
  configFile: string,
  rendered: string | undefined,
  template: string,
  templateText: string,
  tail: string,
  flavour: K3sFlavour,
  options: ContainerdConfigOptions,
): ContainerdConfigPlan {
  if (rendered === undefined) {
    throw new NodeSetupError(
      `${configFile} does not exist: ${flavour} has not rendered ${template} yet; start ${flavour}, then run node-setup again`,
    );
  }
  const what = `${template} (as rendered into ${configFile})`;
  if (!rendered.endsWith(tail)) {
    // The template changed since it was rendered (node-setup --no-restart, or an edit by hand):
    // nothing to do if its TOML already holds every setting, else the base's part is unknown.
    const plan = planContainerdConfig(rendered, what, options);
    if (plan.settings.every((s) => valueAt(parsedOrEmpty(tail), [...s.table, s.key]) === s.value)) {
      return { ...plan, text: templateText, changes: [], settings: [] };
    }
    throw new NodeSetupError(
      `${configFile} does not end with the TOML that follows {{ template "base" . }} in ${template}: ${flavour} has not rendered the template since it changed; restart ${flavour}, then run node-setup again`,
    );
  }
  const baseEnd = rendered.length - tail.length;
  const plan = planContainerdConfig(rendered, what, {
    ...options,
    locked: {
      end: baseEnd,
      reason: `${flavour}'s base template sets it, and the TOML after {{ template "base" . }} can only add tables the base lacks; replace the template with a full one (a copy of ${configFile}) to change it`,
    },
  });
  return { ...plan, text: templateText.slice(0, templateText.length - tail.length) + plan.text.slice(baseEnd) };
}

function parsedOrEmpty(text: string): Record<string, unknown> {
  try {
    return parseToml(text, 'template');
  } catch {
    return {};
  }
}
