/**
 * The panel's icons: JupyterLab's own where one fits, trainhub's SVGs (registered as LabIcon,
 * so they follow the theme) for the rest. No emoji: they need an emoji font to show.
 */
import {
  copyIcon,
  deleteIcon,
  downloadIcon,
  fileIcon,
  fileUploadIcon,
  folderIcon,
  LabIcon,
  launchIcon,
  refreshIcon,
  stopIcon,
  textEditorIcon
} from '@jupyterlab/ui-components';

const svg = (body: string) =>
  `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16"><g class="jp-icon3" fill="#616161">${body}</g></svg>`;

export const trainhubIcon = new LabIcon({
  name: 'trainhub:icon',
  svgstr: svg('<path d="M4 4h16v4H4zm0 6h10v4H4zm0 6h16v4H4z"/>')
});

export const datasetsIcon = new LabIcon({
  name: 'trainhub:datasets',
  svgstr: svg(
    '<ellipse cx="12" cy="6" rx="7" ry="3"/>' +
      '<path d="M5 9c0 1.7 3.1 3 7 3s7-1.3 7-3v3c0 1.7-3.1 3-7 3s-7-1.3-7-3z"/>' +
      '<path d="M5 15c0 1.7 3.1 3 7 3s7-1.3 7-3v3c0 1.7-3.1 3-7 3s-7-1.3-7-3z"/>'
  )
});

export const modelsIcon = new LabIcon({
  name: 'trainhub:models',
  svgstr: svg('<path d="M12 2 3 7v10l9 5 9-5V7zm0 2.3L18.6 8 12 11.7 5.4 8zM5 9.7l6 3.4v6.6l-6-3.3zm8 10v-6.6l6-3.4v6.7z"/>')
});

export const jobsIcon = new LabIcon({
  name: 'trainhub:jobs',
  svgstr: svg('<path d="M3 5h12v2H3zm0 4h12v2H3zm0 4h7v2H3zm10 0 8 4.5-8 4.5z"/>')
});

export const usageIcon = new LabIcon({
  name: 'trainhub:usage',
  svgstr: svg('<path d="M3 19.5h18V21H3zM4.5 11h3.5v7H4.5zm5.75-7h3.5v14h-3.5zM16 8h3.5v10H16z"/>')
});

export const metricsIcon = new LabIcon({
  name: 'trainhub:metrics',
  svgstr: svg('<path d="M3 19h18v2H3zm1-3.3 5-6 4 3 6-8 1.6 1.2-7.2 9.6-4-3-3.9 4.7z"/>')
});

export const tensorboardIcon = new LabIcon({
  name: 'trainhub:tensorboard',
  svgstr: svg('<path d="M12 2 3 7v10l9 5 9-5V7zm-1 17.4-6-3.3V8.6l6 3.4zm2 0V12l6-3.4v7.5zM12 10.3 6 7l6-3.3L18 7z" opacity=".9"/>')
});

export const registerIcon = new LabIcon({
  name: 'trainhub:register',
  svgstr: svg('<path d="M12 2 3 7v10l9 5 3-1.7V18l-3 1.7-7-3.9V9.7l6 3.4v3.4h2v-3.4l6-3.4v4.2h2V7zm0 9.7L5.4 8 12 4.3 18.6 8zM19 15h-2v3h-3v2h3v3h2v-3h3v-2h-3z"/>')
});

export {
  copyIcon,
  deleteIcon,
  downloadIcon,
  fileIcon,
  fileUploadIcon,
  folderIcon,
  launchIcon,
  refreshIcon,
  stopIcon,
  textEditorIcon as logsIcon
};
