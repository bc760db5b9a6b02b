import asyncio
import tools

stats = await tools.helpdesk.ticket_stats()
processed, flagged = 0, []
for i in range(200):
    record = {"id": i, "score": (i * 37) % 101}
    if record["score"] > 95:
        flagged.append(record["id"])
    processed += 1
    if processed % 20 == 0:
        emit({"progress": processed, "total": 200, "label": "records"})
        await asyncio.sleep(0.2)   # pretend each batch takes a while
{"processed": processed, "flagged": flagged, "open_tickets": stats["by_status"]["open"]}
