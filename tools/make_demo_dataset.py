"""Write the bundled demo dataset: an internal help-desk log whose users speak an in-house vocabulary.

The demo must show what training on a private query log buys over a public encoder, so its data
has a property the public model cannot know: the staff of a fictional organisation call its
internal systems and forms by nicknames and codes ("kettle", "form 27", "VR-9") that the
knowledge-base articles never use; the articles spell out the formal names ("Travel and Expense
Claims Portal"). Every system has articles on the same kinds of task (sign-in problems, deadlines,
approvals, ...), so a query such as "kettle cut off this month" matches twenty articles on
deadlines equally well for an encoder that does not know what "kettle" is. The nickname is learnt
from the training queries and transfers to the test queries, which use the same nicknames for
other articles of the same systems (no article has both training and test queries).

Everything here was written for privret. Deterministic: the same script writes the same files.

    python tools/make_demo_dataset.py [--out DIR]    # default: src/privret/data/demo_dataset
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from privret.data.beir import BeirDataset, Document, write_beir

SEED = 12
TRAIN_TASKS, TEST_TASKS = 5, 3  # articles of each system with training / test queries
TRAIN_QUERIES, TEST_QUERIES = 170, 80
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "privret" / "data" / "demo_dataset"


@dataclass(frozen=True)
class System:
    """An internal system or form: its formal name (articles) and its nicknames (queries).

    ``facts`` maps a task (a key of :data:`ARTICLES`) to the system-specific sentences of that
    article; ``user_word`` is the plain word users add when they say what they are doing.
    """

    name: str
    article: str  # "the" or "" before the name in running text
    nicknames: tuple[str, ...]
    item: str
    items: str
    user_word: str
    facts: dict[str, str]
    error: tuple[str, str, str] | None = None  # (code, message, what it means and what to do)

    @property
    def the_name(self) -> str:
        return f"{self.article} {self.name}".strip()

    @property
    def tasks(self) -> list[str]:
        return sorted([*self.facts, *(["error"] if self.error else [])])


SYSTEMS = [
    System("Travel and Expense Claims Portal", "the", ("kettle", "the kettle", "Kettle"), "expense claim",
           "expense claims", "claim", {
               "access": "Every employee receives an account on their first working day. Approvers see the "
                         "approval queue automatically once someone names them as their manager.",
               "login": "The portal signs you in with your normal network account. A blank white page after "
                        "signing in usually means an outdated browser session: clear the cache or open a private "
                        "window and try again.",
               "submit": "open New Claim, add one line per receipt with its date, category and amount, and attach "
                         "a photo or scan of every receipt",
               "approval": "your line manager|within five working days",
               "amend": "A claim can be recalled and edited while it is still waiting for approval. After approval "
                        "it is locked, and corrections are made by the finance systems staff on request.",
               "cutoff": "Claims approved by the 18th of the month are reimbursed with that month's salary; "
                         "anything approved later is paid the following month. Claims for costs older than ninety "
                         "days are rejected automatically.",
               "mobile": "The mobile app can photograph receipts and save them to a draft claim, but the claim "
                         "itself must be submitted from a desktop browser.",
               "export": "a spreadsheet of your claims with their approval and payment status for any date range",
               "eligible": "Employees on the payroll can claim; agency contractors claim through their agency. "
                           "Meals are reimbursed up to 25 pounds a day on overnight trips, and rail travel is "
                           "standard class unless the journey takes longer than three hours.",
               "delegate": "An assistant can prepare claims for a colleague once the colleague adds them as a "
                           "delegate under Settings, but only the claimant can press Submit, because submitting is "
                           "their declaration that the costs are genuine.",
               "support": "Finance Systems team|extension 4410|from 8:00 to 17:30, Monday to Friday",
           }, ("EX-302", "Cost centre not valid for this date",
               "the cost centre on a claim line was closed or renamed. Choose the current code from the drop-down "
               "list, or ask your budget holder which code replaced it")),
    System("Annual Leave and Absence Register", "the", ("sunbed", "Sunbed", "the sunbed"), "leave request",
           "leave requests", "holiday", {
               "access": "Everyone on the staff list has an account. New managers are linked to their team "
                         "automatically when HR records the reporting line.",
               "login": "The register uses single sign-on. If it says your account is not linked, HR has not yet "
                        "finished your starter record.",
               "submit": "choose the dates on the calendar, select the type of absence, add a note for your manager "
                         "if needed and press Request",
               "approval": "your line manager|before the first day of the absence, normally within three working "
                           "days",
               "amend": "A request that is still pending can be withdrawn. Approved leave can be cancelled only "
                        "before it starts, and the cancellation goes back to your manager.",
               "cutoff": "The leave year runs from April to March. Up to five unused days may be carried over into "
                         "the next year if the carry-over is requested by 31 March; the rest lapse.",
               "mobile": "The register works in a phone browser once you are signed in, so sickness can be "
                         "reported from home before 9:30 on the first day of absence.",
               "export": "a calendar file or spreadsheet of your team's planned absences",
               "eligible": "Full-time staff receive 27 days a year plus public holidays; part-time entitlement is "
                           "calculated in hours. Special leave for bereavement, jury service or emergencies has its "
                           "own absence type.",
               "delegate": "Managers who are away can hand their approvals to a deputy for a fixed period from the "
                           "Delegation page; the deputy then sees the team's pending requests.",
               "support": "HR Operations|extension 2205|from 9:00 to 17:00 on working days",
           }, ("LV-17", "Request overlaps an existing absence",
               "the dates touch a booking that already exists, often a half day entered earlier. Cancel or shorten "
               "the older booking first, then request again")),
    System("Payroll Self-Service", "", ("penny", "Penny"), "payslip query", "payslip queries", "payslip", {
        "access": "Accounts are created when your first salary is processed. Until then, your offer letter shows "
                  "your salary and pay date.",
        "login": "Payroll Self-Service asks for a second factor, a code sent by text message. If your phone number "
                 "has changed, payroll staff must update it before you can sign in.",
        "submit": "open My Pay, choose the pay period in question and press Raise a Query, describing what looks "
                  "wrong",
        "approval": "a payroll officer|within ten working days",
        "amend": "Bank details can be changed at any time, but each change sends a confirmation message to your "
                 "previous contact number. An open query can be updated by adding a comment.",
        "cutoff": "Changes to bank details must be entered before the 12th to take effect in the same month's pay. "
                  "Payslips appear three working days before payday.",
        "mobile": "Payslips can be viewed on a phone, but bank details can only be changed from a managed work "
                  "computer, for security.",
        "export": "PDF copies of past payslips and the end-of-year tax certificate",
        "eligible": "Everyone paid through the organisation's payroll has an account, casual workers included. "
                    "Pension contributions and salary sacrifice are shown here but changed through the Pensions "
                    "office.",
        "support": "Payroll Services|extension 3318|from 10:00 to 16:00, Tuesday to Thursday",
    }, ("PY-9", "Verification code expired",
        "the one-time code sent to your phone is valid for five minutes. Request a new code and enter it straight "
        "away")),
    System("Room and Desk Reservation Service", "the", ("bluebird", "Bluebird"), "room booking", "room bookings",
           "room", {
               "access": "All staff can book from their first day. Contractors need a sponsor to request access "
                         "for them.",
               "login": "Sign in with your network account. If the floor map does not load, your browser may be "
                        "blocking scripts from internal sites.",
               "submit": "pick the building and date, filter by capacity or equipment, select a free slot and "
                         "confirm; invitations can be sent from the same screen",
               "approval": "the facilities coordinator of the building|for event spaces within two days, while "
                           "ordinary rooms and desks are confirmed instantly",
               "amend": "Bookings can be moved or cancelled from My Bookings until the start time. Please cancel "
                        "rather than leave a room empty.",
               "cutoff": "Rooms can be reserved up to twelve weeks ahead. A booking nobody checks in to within "
                         "fifteen minutes of its start is released for others.",
               "mobile": "There is a phone app with a check-in button and a floor map showing free desks.",
               "export": "a list of your upcoming and past bookings, or usage figures for a building if you "
                         "coordinate one",
               "eligible": "Staff and long-term contractors can book. Rooms with video conferencing are kept for "
                           "meetings with remote participants during core hours.",
               "delegate": "Personal assistants can book on behalf of others by entering the organiser's name in "
                           "the Booked For field.",
               "support": "Facilities Helpdesk|extension 1100|from 7:30 to 18:00 on working days",
           }, ("RB-40", "Slot exceeds maximum duration",
               "single bookings are limited to four hours. Split the meeting into two bookings or ask the "
               "facilities coordinator for an all-day reservation")),
    System("IT Service Request Catalogue", "the", ("the hatch", "hatch", "Hatch"), "service request",
           "service requests", "ticket", {
               "access": "Everyone with a network account can use the catalogue; no separate access is needed.",
               "login": "If you cannot sign in to your computer at all, call the Service Desk from any phone; they "
                        "reset passwords after checking your identity.",
               "submit": "search the catalogue for what you need, fill in its form and submit it; each request "
                         "gets a reference number",
               "approval": "your line manager, and for paid software also the budget holder|usually on the same "
                           "day",
               "amend": "Add a comment to an open request to change it, or withdraw it from My Requests while it "
                        "awaits approval.",
               "cutoff": "New laptops should be requested ten working days before a starter arrives. Requests left "
                         "without approval for thirty days are closed.",
               "mobile": "The catalogue can be used on a phone, and the Service Desk can also be reached by chat.",
               "export": "the history of your requests with their status and the technician's notes",
               "eligible": "Standard software is free to install; specialist licences are charged to the team's "
                           "budget. Personal devices cannot be connected to the internal network.",
               "delegate": "Managers can raise requests for members of their team, for example equipment for a new "
                           "starter, by choosing Request For Someone Else.",
               "support": "IT Service Desk|extension 5000|around the clock for outages and from 8:00 to 18:00 for "
                          "requests",
           }, ("SR-511", "No catalogue item matches your role",
               "the item is restricted to certain teams. Choose General Request, explain what you need, and the "
               "Service Desk will route it")),
    System("Procurement and Purchase Order System", "the", ("magpie", "Magpie"), "purchase order",
           "purchase orders", "order", {
               "access": "Requisitioner access is requested by your manager on the finance access form; approver "
                         "rights follow the list of budget holders.",
               "login": "The system signs in through the finance gateway. A licence error means your account was "
                        "unused for ninety days and must be reactivated.",
               "submit": "create a requisition, choose a supplier from the approved list, add the items with their "
                         "cost codes and send it for approval; it becomes a purchase order once approved",
               "approval": "the budget holder, and above 10,000 pounds also the Procurement team|within three "
                           "working days",
               "amend": "A purchase order can be amended until the supplier has confirmed it; after that, cancel it, "
                        "raise a new one and tell the supplier.",
               "cutoff": "Orders for the current financial year must be approved by 15 March. Goods must be "
                         "receipted within a week of arrival so that suppliers are paid on time.",
               "mobile": "Approvals can be given from the mobile approval app, but requisitions are created on a "
                         "desktop.",
               "export": "open orders, spending by supplier and invoices waiting for a goods receipt",
               "eligible": "Purchases under 500 pounds can be made with a purchasing card instead. Three quotes are "
                           "required above 10,000 pounds.",
               "delegate": "Budget holders can set an alternate approver for periods of leave from their profile "
                           "page.",
               "support": "Procurement team|extension 6120|from 9:00 to 17:00 on working days",
           }, ("PO-88", "Supplier not on approved list",
               "the supplier has not been vetted. Ask the Procurement team to onboard it, which takes about two "
               "weeks, or choose an approved alternative")),
    System("Corporate Records Archive", "the", ("granite", "Granite"), "record", "records", "file", {
        "access": "Read access follows your team. Rights to declare or retrieve restricted records are granted by "
                  "Information Governance on request.",
        "login": "The archive uses network sign-in, and restricted areas ask you to sign in again every hour.",
        "submit": "choose the right category in the file plan, upload the final version, fill in the title, owner "
                  "and retention class and press Declare as Record",
        "amend": "A declared record cannot be edited. To correct one, declare a new version and link it to the old "
                 "record.",
        "cutoff": "Records are reviewed when their retention period ends; owners get a reminder thirty days before "
                  "the review date.",
        "mobile": "The archive can be searched from a phone, but uploading needs the desktop client.",
        "export": "search results with their metadata, and a retention report for your area",
        "eligible": "Only final versions are declared as records; drafts stay in team drives. Personal data must be "
                    "marked so that subject access requests can find it.",
        "delegate": "Record owners can transfer ownership to a colleague when they change role, from the record's "
                    "Properties page.",
        "support": "Information Governance|extension 2790|from 9:30 to 16:30 on working days",
    }, ("RA-23", "Retention class required",
        "every record needs a retention class before it can be declared. Choose one from the list or ask "
        "Information Governance which applies")),
    System("Learning and Mandatory Training Platform", "the", ("acorn", "Acorn"), "course enrolment",
           "course enrolments", "course", {
               "access": "Accounts are created from the staff list within a day of your start date.",
               "login": "If the platform shows a guest page, sign out of other accounts in your browser and sign in "
                        "again with your work account.",
               "submit": "search the course list, open the course and press Enrol; workshops show the dates still "
                         "available",
               "approval": "your line manager, for courses that cost money|within five working days",
               "amend": "You can withdraw from a workshop under My Learning; the place is then offered to the next "
                        "person on the waiting list.",
               "cutoff": "Mandatory courses must be finished within six weeks of your start date and renewed every "
                         "two years. Workshop places can be cancelled free of charge up to seven days before.",
               "mobile": "Most e-learning modules play on a phone or tablet, and progress is saved as you go.",
               "export": "a certificate for each completed course and a transcript of your training history",
               "eligible": "All staff and volunteers take the mandatory courses. External courses are funded up to "
                           "1,500 pounds a year per person with the manager's approval.",
               "delegate": "Managers can enrol members of their team and follow the team's completion dashboard.",
               "support": "Learning and Development|extension 4732|from 9:00 to 17:00 on working days",
           }, ("LM-5", "Module did not record completion",
               "the browser closed before the last page reported back. Reopen the module, go to the final page and "
               "press Exit rather than closing the window")),
    System("Visitor and Contractor Registration", "", ("VR-9", "vr9", "the VR9 form"), "visitor registration",
           "visitor registrations", "visitor", {
               "access": "Any member of staff can register their own visitors with their network account.",
               "submit": "enter the visitor's name, company, arrival date and the host's name, and tick whether "
                         "they will do physical work on site",
               "approval": "the site safety officer, for contractors doing physical work (ordinary visitors need "
                           "no approval)|within two working days",
               "amend": "Change the arrival date or cancel the registration from the link in the confirmation "
                        "email, or ask reception.",
               "cutoff": "Register visitors by 16:00 on the working day before they arrive; contractors need three "
                         "working days for the safety check.",
               "mobile": "The registration form works on a phone, and reception can register a walk-in visitor if "
                         "the host comes down to meet them.",
               "export": "a list of the visitors expected at a site on a given day, for hosts and reception",
               "eligible": "Visitors must be accompanied at all times. Contractors working on site for more than "
                           "four weeks apply for a contractor pass instead.",
               "delegate": "Team administrators can register visitors for any host in their department.",
               "support": "Reception and Security|extension 1000|from 7:00 to 19:00 every day",
           }, ("REG-3", "Host not found",
               "the host's name must match the staff directory exactly. Search by surname or staff number")),
    System("Flexible and Remote Working Request", "the", ("form 27", "the 27 form", "F27"),
           "flexible working request", "flexible working requests", "working from home", {
               "access": "The request form is on the staff intranet under HR forms and can be started by anyone "
                         "employed for more than a week.",
               "submit": "describe the pattern you want, how your work will be covered and from what date, and "
                         "send the request to your manager",
               "approval": "your line manager, then HR for contractual changes|within two months at the latest, "
                           "and usually much sooner",
               "amend": "A request can be withdrawn before the decision. After a trial period either side may ask "
                        "to review the arrangement.",
               "cutoff": "Allow eight weeks before the date you want the change to start. One request can be made "
                         "in any twelve-month period.",
               "eligible": "Any employee may ask; the request can be refused only for a listed business reason, "
                           "which must be given in writing. Home workers receive a display screen assessment.",
               "delegate": "A union representative or colleague may accompany you to the meeting about the "
                           "request.",
               "support": "HR Operations|extension 2205|from 9:00 to 17:00 on working days",
           }, ("FW-2", "Trial period end date missing",
               "a trial arrangement needs an end date. Enter the date on which you and your manager will review it")),
    System("Pool Vehicle Booking Service", "the", ("tortoise", "Tortoise"), "vehicle booking", "vehicle bookings",
           "car", {
               "access": "Ask the Fleet Office for driver access; it is granted once your licence check is done.",
               "login": "The booking service uses network sign-in; drivers without a computer can book by phone "
                        "with the Fleet Office.",
               "submit": "choose the depot, dates and vehicle type, enter the destination and an estimate of the "
                         "mileage and confirm; the key safe code is emailed the day before",
               "approval": "your line manager, for overnight bookings|within one working day",
               "amend": "Change or cancel a booking from My Journeys; cancel at least two hours ahead so the "
                        "vehicle can go to someone else.",
               "cutoff": "Bookings close at 15:00 on the day before travel. Vehicles must be returned with at least "
                         "a quarter of a tank of fuel.",
               "export": "your journeys and mileage, for expense or tax records",
               "eligible": "Drivers need a full licence held for two years and a signed driver declaration. Private "
                           "use of pool vehicles is not allowed.",
               "support": "Fleet Office|extension 7040|from 7:00 to 17:00 on working days",
           }, ("FL-12", "Driving licence check outstanding",
               "a licence check is needed every year. Complete the online licence consent form and allow two days")),
    System("Performance and Development Review", "the", ("orbit", "Orbit"), "review", "reviews", "objectives", {
        "access": "The review form opens for everyone who has passed probation at the start of April.",
        "submit": "add three to five objectives for the year, complete the self-assessment and share the form with "
                  "your manager before the meeting",
        "approval": "your line manager, then their own manager as countersigning reviewer|within a month of the "
                    "meeting",
        "amend": "Objectives can be changed during the year if you and your manager agree; the history of changes "
                 "is kept.",
        "cutoff": "Reviews take place between April and June, with a mid-year check-in in October.",
        "export": "a PDF of the completed form, signed by both reviewers",
        "eligible": "Everyone past probation takes part; staff on probation follow the probation review process "
                    "instead.",
        "delegate": "If your manager leaves, HR reassigns your review to the new manager, who sees the earlier "
                    "entries.",
        "support": "HR Operations|extension 2205|from 9:00 to 17:00 on working days",
    }),
    System("Health and Safety Incident Reporting", "", ("lantern", "Lantern"), "incident report", "incident reports",
           "accident", {
               "access": "Anyone with a network account can report; visitors report through their host.",
               "submit": "describe what happened, when and where, who was involved and any injury, and attach "
                         "photos if there are any",
               "approval": "the manager responsible for the area, who investigates|with the investigation "
                           "starting within two working days",
               "amend": "Details can be added to a report until the investigation closes; ask the safety advisers "
                        "to correct anything already investigated.",
               "cutoff": "Report within 24 hours. A serious injury must also be reported by phone to the safety "
                         "advisers at once.",
               "mobile": "Incidents can be reported on a phone from the scene, and photos taken with it are "
                         "attached directly.",
               "export": "incident statistics for your department, by type and month",
               "eligible": "Near misses are reported as well as injuries. Reports can be made anonymously.",
               "delegate": "A colleague can file the report for someone who was injured, who then confirms the "
                           "details.",
               "support": "Safety Advisers|extension 3999|from 8:00 to 18:00 on working days",
           }, ("HS-71", "Location not recognised",
               "choose the building from the list and describe the exact spot in the text field")),
    System("Customer Complaints Case Management", "", ("the hive", "hive", "Hive"), "complaint case",
           "complaint cases", "case", {
               "access": "The Complaints Officer gives access to customer-facing teams.",
               "login": "Sign in with your network account; after twenty minutes without activity the case screen "
                        "locks and unsaved notes are lost.",
               "submit": "log the complainant's contact details, summarise the complaint, choose the service area "
                         "and assign a case handler",
               "approval": "the service manager, who signs off the final response|in time for the response deadline",
               "amend": "Case details can be corrected until the case is closed; only the service manager can "
                        "reopen a closed case.",
               "cutoff": "Stage one complaints are answered within ten working days and stage two within twenty.",
               "export": "case volumes and response times by service area",
               "eligible": "Complaints about events more than twelve months old are accepted only in exceptional "
                           "cases.",
               "delegate": "Cases can be reassigned to another handler from the case header when you are absent.",
               "support": "Complaints Officer|extension 6650|from 9:00 to 17:00 on working days",
           }, ("CC-44", "Duplicate complainant record",
               "a person with the same contact details is already on file. Open the existing record and add the new "
               "complaint to it")),
    System("Secure File Transfer Service", "the", ("pelican", "Pelican"), "file transfer", "file transfers", "send", {
        "access": "Anyone with a network account can send files; receiving from outside needs a request link.",
        "login": "The service signs you in with your network account and asks for the authenticator app the first "
                 "time on each device.",
        "submit": "add the recipient's email address, upload the files, set an expiry date and send; the recipient "
                  "gets a link and, separately, a passcode",
        "amend": "A transfer can be revoked from Sent Items at any time, which disables the link immediately.",
        "cutoff": "Links expire after fourteen days by default, and files are deleted after thirty days at most.",
        "mobile": "Files can be downloaded on a phone, but uploads are limited to 2 GB there.",
        "export": "a log of your transfers showing when each was downloaded",
        "eligible": "Files containing personal data need a data sharing agreement in place before they are sent.",
        "support": "IT Service Desk|extension 5000|around the clock",
    }, ("ST-6", "Attachment exceeds the allowed size",
        "the limit is 20 GB per transfer. Compress the files or split them across two transfers")),
    System("Mobile Device and Phone Allowance", "the", ("M4", "the m4 form", "m4"), "device request",
           "device requests", "phone", {
               "access": "The request form is on the staff intranet under IT forms.",
               "submit": "explain why your role needs a phone, choose between a work handset and the allowance, "
                         "and send it to your manager",
               "approval": "your line manager, then the IT asset team for handsets|within five working days",
               "amend": "To switch from a handset to the allowance, return the handset to the IT asset team and "
                        "submit a new request.",
               "cutoff": "An allowance approved by the 10th starts in the same month's pay.",
               "eligible": "Staff who are on call, or who work away from a desk for most of the week, qualify. The "
                           "allowance is 15 pounds a month.",
               "delegate": "Managers can request handsets for a whole team on one request.",
               "support": "IT Service Desk for handsets and Payroll Services for the allowance|extension 5000|from "
                          "8:00 to 18:00",
           }),
    System("Staff Identity Badge and Building Access", "", ("otter", "Otter"), "badge request", "badge requests",
           "pass", {
               "access": "New starters request their badge before the first day; building access follows the team "
                         "they join.",
               "submit": "upload a passport-style photo, confirm your building and floor and submit; collect the "
                         "badge from reception with photo ID",
               "approval": "the building manager, for access to restricted areas|within three working days",
               "amend": "Extra door access is requested, and unneeded access removed, from the same page.",
               "cutoff": "Lost badges are cancelled within an hour of being reported; a replacement takes two "
                         "working days.",
               "mobile": "A digital badge can be added to your phone's wallet to open the main entrance.",
               "eligible": "Badges must be worn visibly in all buildings. Visitors receive a day pass instead.",
               "delegate": "Team administrators can request door access for members of their team.",
               "support": "Security Office|extension 1001|around the clock",
           }, ("BA-15", "Photo rejected",
               "the photo must show your face clearly against a plain background. Take a new one and upload it")),
    System("Budget Forecasting and Cost Centre Reporting", "", ("tundra", "Tundra"), "forecast", "forecasts",
           "numbers", {
               "access": "Budget holders and their nominated finance contacts have access; ask your finance "
                         "business partner to add a contact.",
               "login": "Sign in through the finance gateway; reports open in a separate window that pop-up "
                        "blockers may stop.",
               "submit": "open your cost centre, update the forecast for the remaining months, comment on each "
                         "large change and submit",
               "approval": "the finance business partner for your directorate|within five working days",
               "amend": "A submitted forecast can be reopened until the month is closed.",
               "cutoff": "Forecasts are due on the fifth working day of each month; the ledger closes on the third.",
               "export": "budget reports by cost centre and account code, as spreadsheets",
               "delegate": "A budget holder can nominate a deputy to submit forecasts while away.",
               "support": "Financial Planning team|extension 6300|from 9:00 to 17:00 on working days",
           }, ("BF-60", "Period is locked",
               "the month has closed. Enter the change in the next open period")),
    System("Internal Vacancies and Secondments", "", ("juniper", "Juniper"), "job application", "job applications",
           "apply", {
               "access": "All staff can browse the vacancies; applying uses the same network account.",
               "submit": "open the vacancy, upload your CV, answer the supporting statement questions and submit "
                         "before the closing date",
               "amend": "You can withdraw an application at any time, but it cannot be edited after submission.",
               "cutoff": "Vacancies close at midnight on the closing date, and late applications are not accepted.",
               "mobile": "Vacancies can be read on a phone; applications are easier from a computer because of the "
                         "CV upload.",
               "eligible": "Staff who have passed probation can apply. Secondments need at least six months in your "
                           "current post and your manager must be told, although their agreement is not needed to "
                           "apply.",
               "support": "Recruitment team|extension 2230|from 9:00 to 17:00 on working days",
           }, ("JV-2", "File type not supported",
               "CVs must be PDF or Word documents under 5 MB")),
    System("Gifts, Hospitality and Interests Register", "the", ("G2", "the g2", "g2 form"), "declaration",
           "declarations", "gift", {
               "access": "Every member of staff can make declarations; managers see those of their team.",
               "submit": "state what was offered, by whom, its estimated value and whether you accepted it",
               "approval": "your line manager, and the Monitoring Officer for anything worth more than 100 "
                           "pounds|within ten working days",
               "amend": "A declaration can be updated, for example when a gift is returned, but never deleted.",
               "cutoff": "Declare within 28 days of the offer, and confirm your outside interests every April.",
               "export": "the published register of declarations for senior staff",
               "eligible": "Gifts worth less than 25 pounds need not be declared, and cash is never accepted.",
               "support": "Legal and Governance team|extension 2100|from 9:00 to 17:00 on working days",
           }),
]


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def article(system: System, task: str, variant: int) -> tuple[str, str]:
    """(title, text) of the knowledge-base article on ``task`` for ``system``, in one of several wordings."""
    s, name, the = system, system.name, system.the_name
    fact = s.facts.get(task, "")
    if task == "access":
        return [(f"Getting access to {the}", f"{_cap(the)} is where {s.items} are handled. {fact}"),
                (f"Who can use {the}", f"{fact} Questions about permissions in {the} go to the system owner."),
                (f"Accounts and permissions: {name}", f"Accounts for {the}. {fact}")][variant % 3]
    if task == "login":
        return [(f"Signing in to {the}", f"{fact}"),
                (f"{name}: sign-in problems", f"Trouble signing in to {the}? {fact}"),
                (f"Cannot log in to {the}", f"{fact} Locked accounts are reset by the system's support team.")
                ][variant % 3]
    if task == "submit":
        return [(f"How to submit a new {s.item}", f"To make a new {s.item} in {the}, {fact}. A confirmation email "
                                                  "with a reference number follows."),
                (f"{name}: creating {_a(s.item)}", f"Step by step: {fact}. Until it is submitted, the {s.item} is "
                                                   "saved as a draft."),
                (f"Starting {_a(s.item)}", f"In {the}, {fact}.")][variant % 3]
    if task == "approval":
        who, when = fact.split("|")
        return [(f"Who approves {_a(s.item)}", f"Every {s.item} in {the} goes to {who}. A decision normally comes "
                                               f"{when}; send a reminder from the request page if it is late."),
                (f"Approval of {s.items} in {the}", f"{_cap(s.items)} are approved by {who}, {when}. The status "
                                                    "changes to Approved or Returned, with a comment."),
                (f"Waiting for approval: {name}", f"{_cap(_a(s.item))} waits for {who}. Expect an answer {when}. "
                                                  "If it is still pending after that, contact the approver directly.")
                ][variant % 3]
    if task == "amend":
        return [(f"Changing or withdrawing {_a(s.item)}", f"{fact} This applies to every {s.item} in {the}."),
                (f"Correcting a mistake in {the}", f"Made an error in {_a(s.item)}? {fact}"),
                (f"Cancelling {_a(s.item)} in {the}", f"{fact}")][variant % 3]
    if task == "cutoff":
        return [(f"Deadlines for {s.items}", f"{fact} The dates for the year are listed on the home page of {the}."),
                (f"{name}: cut-off dates", f"{fact}"),
                (f"Timing and deadlines in {the}", f"Plan ahead: {fact}")][variant % 3]
    if task == "mobile":
        return [(f"Using {the} on a phone", f"{fact} Outside the office, connect to the staff VPN first."),
                (f"{_cap(the)} away from the office", f"{fact}")][variant % 2]
    if task == "export":
        return [(f"Reports and exports from {the}", f"{_cap(the)} can export {fact}. Choose Reports, set the date "
                                                     "range and the format, and the file is ready within minutes."),
                (f"Downloading your history from {the}", f"Under Reports you can download {fact}.")][variant % 2]
    if task == "eligible":
        return [(f"Rules and limits for {s.items}", f"{fact} The full policy is linked from {the}."),
                (f"Eligibility: {name}", f"{fact}")][variant % 2]
    if task == "delegate":
        return [(f"Acting for a colleague in {the}", f"{fact}"),
                (f"Delegates and deputies: {name}", f"Working on behalf of someone else in {the}: {fact}")
                ][variant % 2]
    if task == "support":
        team, phone, hours = fact.split("|")
        return [(f"Support for {the}", f"{_cap(the)} is supported by the {team}, on {phone}, {hours}. Report faults "
                                        "with a screenshot of the message you see."),
                (f"Who looks after {the}", f"Contact the {team} ({phone}) for help with {the}. They answer {hours}."),
                ][variant % 2]
    if task == "error":
        code, message, meaning = s.error
        return [(f"{name} error {code}: {message}", f"When {the} shows \"{code} {message}\", {meaning}."),
                (f"What \"{message}\" means", f"The message {code} ({message}) in {the} means that {meaning}.")
                ][variant % 2]
    raise ValueError(task)


# What users type: {n} the nickname, {w} the plain word of the system ({aw} with "a" or "an"), {c} {m} the
# error's code and message.
QUERIES = {
    "access": ["how do i get access to {n}", "need an account for {n}", "who gives permissions for {n}",
               "{n} access for a new starter", "cant see {n} in my apps how do i get it", "{n} access {w}"],
    "login": ["{n} wont let me log in", "{n} login problem", "locked out of {n}", "{n} blank page after signing in",
              "can't sign into {n} today", "{n} password not working"],
    "submit": ["how to submit on {n}", "how do i put {aw} through {n}", "{n} new {w}", "steps to do {aw} in {n}",
               "where do i start a new one in {n}", "first time using {n}, how do i send it"],
    "approval": ["who approves {n}", "{n} still pending approval", "how long does {n} approval take",
                 "my {w} is stuck waiting in {n}", "chasing an approval on {n}", "{n} who signs off"],
    "amend": ["cancel {aw} in {n}", "made a mistake on {n} how do i change it", "withdraw something i sent on {n}",
              "edit {n} after submitting", "{n} undo", "change my {w} on {n}"],
    "cutoff": ["{n} deadline this month", "when is the {n} cut off", "is there a cutoff for {n}",
               "too late for {n} this month?", "{n} deadlines {w}", "last date for {n}"],
    "mobile": ["can i use {n} on my phone", "{n} from home", "is there an app for {n}", "does {n} work off site",
               "{n} on mobile"],
    "export": ["export from {n}", "download my history from {n}", "{n} report to excel",
               "get a list of everything in {n}", "{n} {w} report"],
    "eligible": ["am i eligible for {n}", "{n} limits", "{n} rules", "what's allowed on {n}",
                 "does {n} apply to me", "{n} policy {w}"],
    "delegate": ["fill in {n} for my boss", "set up a delegate in {n}", "someone to cover my {n} while on leave",
                 "can my assistant do {n} for me", "{n} on behalf of someone else"],
    "support": ["who supports {n}", "{n} helpdesk number", "{n} is down who do i call", "{n} support hours",
                "who to ring about {n}"],
    "error": ["{n} error {c}", "{n} says {m}", "{c} on {n}", "what does {c} mean in {n}", "{n} {m} ???"],
}


def make_dataset(seed: int = SEED) -> BeirDataset:
    """The demo dataset: one article per (system, task), queries with nicknames, disjoint train/test articles."""
    rng = random.Random(seed)
    corpus: dict[str, Document] = {}
    train_docs, test_docs = [], []  # (system, task, doc id)
    for s in SYSTEMS:
        tasks = rng.sample(s.tasks, TRAIN_TASKS + TEST_TASKS)
        for i, task in enumerate(tasks):
            doc_id = f"d{len(corpus) + 1:03d}"
            title, text = article(s, task, rng.randrange(6))
            corpus[doc_id] = Document(doc_id, title, text)
            (train_docs if i < TRAIN_TASKS else test_docs).append((s, task, doc_id))
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for split, prefix, docs, total in (("train", "tr", train_docs, TRAIN_QUERIES),
                                       ("test", "te", test_docs, TEST_QUERIES)):
        order = rng.sample(docs, len(docs))
        wanted = [2 if i < total - len(docs) else 1 for i in range(len(docs))]  # extra queries go to the first ones
        made = [(s, task, doc_id, text) for (s, task, doc_id), n in zip(order, wanted)
                for text in _queries(rng, s, task, n)]
        rng.shuffle(made)
        qrels[split] = {}
        for i, (_, _, doc_id, text) in enumerate(made):
            qid = f"{prefix}{i + 1:03d}"
            queries[qid] = text
            qrels[split][qid] = {doc_id: 1}
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


def _queries(rng: random.Random, system: System, task: str, n: int) -> list[str]:
    code, message = (system.error[0], system.error[1].lower()) if system.error else ("", "")
    return [template.format(n=rng.choice(system.nicknames), w=system.user_word, aw=_a(system.user_word), c=code,
                            m=message)
            for template in rng.sample(QUERIES[task], n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    write_beir(parser.parse_args().out, make_dataset())


if __name__ == "__main__":
    main()
