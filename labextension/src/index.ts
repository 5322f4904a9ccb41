/**
 * jdist's JupyterLab extension: the "Distributed" left sidebar and the run view.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

import { RunView, createRunWidget } from './runview';
import { DistributedSidebar } from './sidebar';

const OPEN_RUN = 'jdist:open-run';
const SHOW_SIDEBAR = 'jdist:show-sidebar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jdist:plugin',
  description: 'Clusters, ranks and live runs of jdist (distributed PyTorch in Jupyter).',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null) => {
    const tracker = new WidgetTracker<MainAreaWidget<RunView>>({ namespace: 'jdist-run' });

    app.commands.addCommand(OPEN_RUN, {
      label: args => (args.runId ? `Open jdist run ${args.runId}` : 'Open jdist run'),
      execute: args => {
        const runId = String(args.runId ?? '');
        if (!runId) {
          return;
        }
        const existing = tracker.find(w => w.content.runId === runId);
        if (existing) {
          app.shell.activateById(existing.id);
          return existing;
        }
        const widget = createRunWidget(runId);
        void tracker.add(widget);
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
        return widget;
      }
    });

    const sidebar = new DistributedSidebar(runId => void app.commands.execute(OPEN_RUN, { runId }));
    app.shell.add(sidebar, 'left', { rank: 900 });

    app.commands.addCommand(SHOW_SIDEBAR, {
      label: 'Show the Distributed sidebar (jdist)',
      execute: () => app.shell.activateById(sidebar.id)
    });
    palette?.addItem({ command: SHOW_SIDEBAR, category: 'jdist' });

    if (restorer) {
      restorer.add(sidebar, 'jdist-sidebar');
      void restorer.restore(tracker, {
        command: OPEN_RUN,
        args: w => ({ runId: w.content.runId }),
        name: w => w.content.runId
      });
    }
  }
};

export default plugin;
