"""Playground: flip a few choices beside the loss curves they make (Auto-run).

The quick fields sit beside the trail chart; the sidebar holds every other field. With
Auto-run on, each settled change launches a short run and its loss joins the chart.
"""

from blockviz.core.presets import PLAYGROUND_PRESET
from blockviz.dashboard import playground, sidebar, store_access, ui
from blockviz.dashboard.config_fields import QUICK_FIELDS

state = sidebar.state(elsewhere=QUICK_FIELDS, start=PLAYGROUND_PRESET)
store = store_access.store_or_stop()
ui.show_flashes()
store_access.store_notice(store)
playground.render(state, store)
